import sys

from kvgrant.cli import main

sys.exit(main())
