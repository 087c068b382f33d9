"""``python -m h5pack``: the command line (e.g. under ``torchrun -m h5pack convert ...``)."""

from h5pack.cli.main import main

main()
