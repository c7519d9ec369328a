import sys

from sovereignspec.cli import main

sys.exit(main())
