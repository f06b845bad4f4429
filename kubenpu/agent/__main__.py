"""python -m kubenpu.agent"""

import sys

from kubenpu.agent import main

sys.exit(main())
