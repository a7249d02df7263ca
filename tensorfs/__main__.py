import sys

from tensorfs.cli import main

sys.exit(main())
