"""The benchmark (`make bench`, `autogen bench`): see autogen/bench.py."""
from autogen.bench import main

if __name__ == "__main__":
    main()
