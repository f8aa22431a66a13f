import sys

from packrat_daemon.cli import main

sys.exit(main())
