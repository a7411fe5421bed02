from turbotrain.cli import main

raise SystemExit(main())
