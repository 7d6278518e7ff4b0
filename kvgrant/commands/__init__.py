"""One module per ``kvgrant`` subcommand: ``add_parser(subparsers)`` sets ``run``."""
