"""`python -m scripts.render SOURCE...`: prints each source's block (see `scripts.render`)."""

import sys

from scripts.render import render

for source in sys.argv[1:]:
    print(render(source))
