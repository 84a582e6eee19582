"""`python -m epp` is the `epp` command."""

from epp.cli import main

raise SystemExit(main())
