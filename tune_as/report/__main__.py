from tune_as.report.cli import main

raise SystemExit(main())
