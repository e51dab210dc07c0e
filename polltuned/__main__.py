from polltuned.cli.main import main

raise SystemExit(main())
