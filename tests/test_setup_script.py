"""scripts/setup.sh is quiet when the install works (no setuptools banner) and loud when it fails: run on a copy of
the repository's layout whose `.venv/bin/python` is a stand-in printing what pip and setuptools print."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BANNER = """/usr/lib/python3/dist-packages/setuptools/command/editable_wheel.py:123: SetuptoolsDeprecationWarning: x
!!

        ********************************************************************************
        Editable install without a build backend hook
        ********************************************************************************

!!"""


def _layout(tmp_path: Path, rc: int) -> Path:
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "python"
    fake.write_text("#!/usr/bin/env bash\n"
                    'if [ "$2" = pip ] && [ "$3" = install ] && [ "$5" = -e ]; then\n'
                    f"  cat >&2 <<'X'\n{BANNER}\nX\n"
                    f'  [ {rc} = 0 ] || echo "ERROR: No matching distribution found for numba" >&2\n'
                    f"  exit {rc}\nfi\nexit 0\n")
    (bin_dir / "streamfed").write_text("#!/usr/bin/env bash\nexit 0\n")
    for f in (fake, bin_dir / "streamfed"):
        f.chmod(0o755)
    return tmp_path


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="the script checks Debian packages with dpkg")
def test_setup_is_quiet_when_it_works_and_loud_when_it_fails(tmp_path):
    env = {**os.environ, "STREAMFED_APT_PACKAGES": "bash"}  # installed everywhere: nothing to apt-get
    ok = subprocess.run(["bash", "scripts/setup.sh"], cwd=_layout(tmp_path / "ok", 0), capture_output=True,
                        text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "" and ok.stderr == ""  # no banner, nothing of pip's
    bad = subprocess.run(["bash", "scripts/setup.sh"], cwd=_layout(tmp_path / "bad", 1), capture_output=True,
                         text=True, env=env, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: installing streamfed into .venv failed")
    assert "No matching distribution found for numba" in bad.stderr
