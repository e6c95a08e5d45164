import os
import sys

# reference.py and graphs.py are plain modules beside the tests, not part of the package.
sys.path.insert(0, os.path.dirname(__file__))
