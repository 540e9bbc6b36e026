"""The installed ``blitz`` command: ``blitz.cli`` plus the subcommands that need Ray.

``blitz/`` never imports Ray, so ``embed`` (a Ray Data job) is added here, where the
Ray glue lives; the console script points at this module.
"""

from __future__ import annotations

import sys

from blitz import cli
from deployments.bulk import add_embed_command


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, extend=add_embed_command)


if __name__ == "__main__":
    sys.exit(main())
