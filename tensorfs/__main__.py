import sys

from tensorfs.cli.main import main

sys.exit(main())
