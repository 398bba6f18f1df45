"""python/ is a package pip installs: pyproject.toml builds (offline, with
Debian's setuptools) and the installed copy imports and runs its command line,
away from the source tree.  Built from a copy, so the tree gets no build/."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


class Install(unittest.TestCase):
    def test_pip_install(self):
        with tempfile.TemporaryDirectory(prefix="fb-py-install-") as d:
            copy, target = os.path.join(d, "src"), os.path.join(d, "site")
            shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                     "__pycache__"))
            r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                                "--no-build-isolation", "--target", target, copy],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            env = dict(os.environ, PYTHONPATH=target)
            r = subprocess.run([sys.executable, "-c", "import fusebox; print(fusebox.__file__)"],
                               capture_output=True, text=True, env=env, cwd=d, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(target), r.stdout)
            r = subprocess.run([sys.executable, "-m", "fusebox", "--help"], capture_output=True,
                               text=True, env=env, cwd=d, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            for verb in ("submit", "sweep", "ls", "watch", "download", "cancel"):
                self.assertIn(verb, r.stdout)
            self.assertTrue(os.path.exists(os.path.join(target, "bin", "fusebox")))


if __name__ == "__main__":
    unittest.main()
