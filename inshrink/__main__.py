from .cli.parser import main

raise SystemExit(main())
