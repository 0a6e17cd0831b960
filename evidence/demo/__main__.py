from evidence.demo.experiment import main

raise SystemExit(main())
