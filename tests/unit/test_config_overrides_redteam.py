"""Red-team findings on config overrides and the written config (issue #5 and its minors).

Args the command line gives survive a factory change in every override form; quoted override keys are TOML
keys; `to_toml` output loads back to the same values, types included (datetimes, huge ints, nan)."""
from __future__ import annotations

import datetime as dt
import math
import random
import sys

import pytest

from turbotrain.cli import main
from turbotrain.config import apply_override, config_from_dict, load_config, to_toml
from turbotrain.errors import UserError

BASE = """
[model]
name = "old.pkg:model"
[model.args]
dim = 8
keep = 1
a = { c = 3 }

[data]
name = "old.pkg:data"
batch_size = 8
[data.args]
dim = 8
keep = 1
a = { c = 3 }
"""


@pytest.fixture
def base(tmp_path) -> str:
    path = tmp_path / "base.toml"
    path.write_text(BASE)
    return str(path)


# ---------------------------------------------------------------- 5. args given with a factory change survive

FORMS = [  # (overrides for SEC, the args the new factory gets): the old factory's args go, the given ones stay
    (["SEC.args={dim=4}"], {"dim": 4}),
    (["SEC.args = { dim = 4, a = { b = 1 } }"], {"dim": 4, "a": {"b": 1}}),
    (["SEC.args.a.b=1"], {"a": {"b": 1}}),  # the old factory's a.c is not kept: a belongs to the new one now
    (['SEC.args."a b"=1'], {"a b": 1}),
    (['SEC.args."x.y"=2'], {"x.y": 2}),
    (['SEC.args."dim"=4'], {"dim": 4}),
    (["SEC.args.'dim'=4"], {"dim": 4}),
    (["SEC.args.dim=4"], {"dim": 4}),  # the form that already worked: the control
    (["SEC.args={dim=4}", "SEC.args.n=2"], {"dim": 4, "n": 2}),
    (["SEC.args.n=2", "SEC.args={dim=4}"], {"dim": 4}),  # a later whole table replaces, as without a name change
    ([], {}),
]


@pytest.mark.parametrize("sec", ["model", "data"])
@pytest.mark.parametrize("name_first", [True, False], ids=["name-first", "name-last"])
@pytest.mark.parametrize("given,want", FORMS, ids=[" ".join(f) or "none" for f, _ in FORMS])
def test_args_given_survive_a_factory_change(base, sec, name_first, given, want):
    name = [f'{sec}.name="new.pkg:{sec}"']
    given = [g.replace("SEC", sec) for g in given]
    cfg = load_config(base, name + given if name_first else given + name)
    section = getattr(cfg, sec)
    assert section.name == f"new.pkg:{sec}" and section.args == want
    assert sec == "model" or cfg.data.batch_size == 8  # only args belong to the factory


@pytest.mark.parametrize("sec", ["model", "data"])
def test_same_factory_keeps_its_args(base, sec):
    cfg = load_config(base, [f'{sec}.name="old.pkg:{sec}"', f"{sec}.args.a.b=1", f'{sec}.args."dim"=4'])
    assert getattr(cfg, sec).args == {"dim": 4, "keep": 1, "a": {"c": 3, "b": 1}}


def test_factory_change_from_a_file_keeps_every_arg_it_gives(tmp_path, base):
    """The extends path (_merge) was already right; pinned beside the command line's."""
    child = tmp_path / "child.toml"
    child.write_text(f'extends = "{base}"\n[model]\nname = "new.pkg:model"\n[model.args]\ndim = 4\n'
                     '[model.args.a]\nb = 1\n')
    assert load_config(str(child)).model.args == {"dim": 4, "a": {"b": 1}}


# ---------------------------------------------------------------- quoted override keys are TOML keys

@pytest.mark.parametrize("item,path,value", [
    ('data.args."n"=32', ["data", "args", "n"], 32),
    ('model.args."a b"=1', ["model", "args", "a b"], 1),
    ("model.args.'lit.key'=1", ["model", "args", "lit.key"], 1),
    ('model.args."a=b"=1', ["model", "args", "a=b"], 1),  # the = inside quotes is part of the key
    ('model.args."q\\"t"="v"', ["model", "args", 'q"t'], "v"),
    ('"train".steps=7', ["train", "steps"], 7),
    ('train . "steps" = 7', ["train", "steps"], 7),
    ('model.args.""=1', ["model", "args", ""], 1),
    ("model.args.café=1", ["model", "args", "café"], 1),  # unquoted: split on dots as before, non-ASCII too
    ("train.steps = 7", ["train", "steps"], 7),
])
def test_override_keys_parse_as_toml_keys(item, path, value):
    raw: dict = {}
    apply_override(raw, item)
    want: object = value
    for part in reversed(path):
        want = {part: want}
    assert raw == want


@pytest.mark.parametrize("item", ['model.args."a=1', 'model.args."a"b=1', "model.args.'x'", '"train"=3',
                                  'model.args."a" "b"=1', 'train.."x"=1'])
def test_malformed_quoted_override_keys_refused(item):
    with pytest.raises(UserError, match=r'expected SECTION\.KEY=VALUE.*quote a key holding spaces or dots'):
        apply_override({}, item)


def test_quoted_override_replaces_the_existing_key(base):
    assert load_config(base, ['data.args."dim"=32']).data.args == {"dim": 32, "keep": 1, "a": {"c": 3}}


# ---------------------------------------------------------------- the written config loads back the same

def same(a, b) -> bool:
    """Equal with the same types all the way down (True is not 1, "1979-05-27" is not a date); nan equals nan."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)  # to_toml puts sub-tables last
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (dt.date, dt.time)):
        return a.isoformat() == b.isoformat()  # == alone equates the same instant at two offsets
    return a == b


def test_datetime_override_round_trips(tmp_path):
    cfg = load_config("mlp-seed", ["model.args.t=1979-05-27T07:32:00Z", "model.args.d=1979-05-27",
                                   "model.args.h=07:32:00.5", "model.args.l=1979-05-27T07:32:00.999999",
                                   "model.args.o=1979-05-27T00:32:00-07:30"])
    assert isinstance(cfg.model.args["t"], dt.datetime) and cfg.model.args["t"].tzinfo is not None
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg))
    assert same(load_config(str(path)).model.args, cfg.model.args)


def _value(rnd: random.Random, depth: int = 0):
    """A value tomllib can produce: every TOML type, the edges of each."""
    kind = rnd.randrange(10 if depth < 3 else 7)
    if kind == 0:
        return rnd.choice(["", "x", "a b", 'q"', "é😀", "1979-05-27", "nan", "\n\t"])
    if kind == 1:
        return rnd.choice([0, -1, 2**63 - 1, -(2**63), 2**64, 10**30, -(10**4000), 16**5000 - 1])
    if kind == 2:
        return rnd.choice([0.1, -0.0, 5e-324, 1.7976931348623157e308, 1e16, math.inf, -math.inf, math.nan])
    if kind == 3:
        return rnd.choice([True, False])
    if kind == 4:
        tz = rnd.choice([None, dt.timezone.utc, dt.timezone(dt.timedelta(minutes=rnd.randint(-1439, 1439)))])
        return dt.datetime(rnd.randint(1, 9999), rnd.randint(1, 12), rnd.randint(1, 28), rnd.randint(0, 23),
                           rnd.randint(0, 59), rnd.randint(0, 59), rnd.choice([0, 1, 500000, 999999]), tzinfo=tz)
    if kind == 5:
        return dt.date(rnd.randint(1, 9999), rnd.randint(1, 12), rnd.randint(1, 28))
    if kind == 6:
        return dt.time(rnd.randint(0, 23), rnd.randint(0, 59), rnd.randint(0, 59), rnd.choice([0, 123456]))
    if kind == 7:  # arrays: mixed, nested, of (empty) tables
        return [_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    if kind == 8:
        return [{} if rnd.random() < 0.3 else _table(rnd, depth + 1)]
    return _table(rnd, depth + 1)  # sub-tables, empty ones too


def _table(rnd: random.Random, depth: int) -> dict:
    return {rnd.choice(["a", "b c", "d.e", "", "f=g", "ü"]) + str(i): _value(rnd, depth)
            for i in range(rnd.randint(0, 3))}


def test_to_toml_round_trips_every_toml_type_property(tmp_path):
    """load -> to_toml -> load is the identity for args of every type TOML has, and to_toml is a fixed point."""
    rnd = random.Random(5)
    path = tmp_path / "c.toml"
    for i in range(150):
        model_args, data_args = _table(rnd, 0), _table(rnd, 0)
        cfg = config_from_dict({"run": {"name": "rt"}, "model": {"args": model_args}, "data": {"args": data_args}})
        text = to_toml(cfg)
        path.write_text(text, encoding="utf-8")
        back = load_config(str(path))
        assert same(back.model.args, model_args) and same(back.data.args, data_args), (i, text)
        assert to_toml(back) == text, i


# ---------------------------------------------------------------- integers past Python's int-to-text limit

HUGE = "9" * (sys.get_int_max_str_digits() + 1)


def test_huge_integer_override_is_a_user_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the config's folder first on sys.path
    assert main(["config", "mlp-seed", f"model.args.x={HUGE}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "digits; use a smaller number" in err, err


def test_huge_integer_in_a_file_is_a_user_error(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text(f"[model.args]\nx = {HUGE}\n")
    with pytest.raises(UserError, match="an integer of more than .* digits; use a smaller number"):
        load_config(str(path))


def test_huge_hex_integer_is_shown_and_written(tmp_path):
    """Hex has no digit limit: such an int loads, must show in an error and write back (as hex)."""
    path = tmp_path / "hex.toml"
    path.write_text(f"[train]\nsteps = 0x{'f' * 5000}\n")
    with pytest.raises(UserError, match="train.steps = .*too large to show.*out of range"):
        load_config(str(path))
    path.write_text(f"[model.args]\nx = 0x{'f' * 5000}\n")
    cfg = load_config(str(path))
    path.write_text(to_toml(cfg))
    assert load_config(str(path)).model.args == {"x": 16**5000 - 1}
