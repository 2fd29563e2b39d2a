from kit.train.main import main

raise SystemExit(main())
