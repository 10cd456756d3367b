import sys

from ktforge.formats import main

sys.exit(main(sys.argv[1:]))
