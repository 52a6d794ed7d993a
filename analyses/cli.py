"""The `circuits` command line (subcommands arrive with the analyses)."""
import argparse
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="circuits")
    p.parse_args(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
