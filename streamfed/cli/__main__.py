"""`python -m streamfed.cli`: the `streamfed` command."""

from streamfed.cli import app

app()
