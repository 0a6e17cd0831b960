from evidence.report.engine import main

raise SystemExit(main())
