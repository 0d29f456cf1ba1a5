import sys

from attnsvm.cli import main

sys.exit(main())
