import sys
import torch.nn.functional as F
import turbotrain.models.gpt as gpt
from turbotrain.accel.gelu_mlp import gelu_mlp

def forward(self, x):
    b, t, d = x.shape
    q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
    q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
    x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
    return x + self.drop(gelu_mlp(self.ln2(x), self.fc, self.out))

gpt.Block.forward = forward
from turbotrain.cli import main
sys.argv[0] = "turbotrain"
raise SystemExit(main())
