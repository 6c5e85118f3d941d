from tune_as.search import main

raise SystemExit(main())
