"""The README and docs/ against the code: the config reference's key tables are the schema's, every file path and
local link they name exists, and the README stays a front door (at most 200 lines)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(f"docs/{name}" for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
# What a page's paths are paths of: docs/GIGATRAIN.md's facts sheet cites GigaTrain's wheel (giga_train/... there
# is its file), docs/GIGATRAIN_PROJECTS.md the public projects' own scripts/; only their other paths are ours.
FOREIGN = {"docs/GIGATRAIN.md": ("## The facts sheet", ("giga_train/",)),
           "docs/GIGATRAIN_PROJECTS.md": (None, ("scripts/",))}
PATH = re.compile(r"`((?:giga_train|tests|bench|examples|scripts|docs)/[\w./-]*)`")


def named_paths(page, text):
    """The repository paths `page` names (as `path`, `path:line` or `path/`)."""
    if page not in FOREIGN:
        ours, rest, foreign = text, "", ()
    else:
        cut, foreign = FOREIGN[page]
        ours, rest = text.split(cut, 1) if cut else ("", text)
    found = PATH.findall(ours) + [p for p in PATH.findall(rest) if not p.startswith(foreign)]
    return {p.split(":")[0].rstrip("/.") for p in found}


@pytest.mark.parametrize("page", PAGES)
def test_every_named_path_and_link_exists(page):
    text = open(os.path.join(ROOT, page)).read()
    missing = [p for p in sorted(named_paths(page, text)) if not os.path.exists(os.path.join(ROOT, p))]
    here = os.path.dirname(os.path.join(ROOT, page))
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in link]
    missing += [link for link in links if link and not os.path.exists(os.path.join(here, link))]
    assert missing == [], f"{page} names what is not there"


def test_the_config_reference_is_the_schemas():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "config_reference.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_readme_is_a_front_door():
    assert len(open(os.path.join(ROOT, "README.md")).read().splitlines()) <= 200
