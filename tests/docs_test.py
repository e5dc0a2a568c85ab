"""The documents' links: every relative link in README.md, BUILD.md, CONTRIBUTING.md and
docs/*.md points to a file that exists and, with a #anchor, to a heading of that file;
and docs/python_api.md's examples run and print what the commands print.

Anchors follow GitHub's rules for headings: lowercase, every character that is not a
letter, digit, space, `-` or `_` dropped, each space a `-`, and a repeated heading gets
`-1`, `-2`, ... Links inside code (fenced or indented blocks, `inline code`) are not
links and are skipped.
"""

import contextlib
import glob
import io
import os
import re

from tests import inprocess
from tests.conftest import REPO_ROOT

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def _prose_lines(text):
  """(line number, line) outside fenced and indented code blocks, inline code removed."""
  fence = None
  previous_blank = True
  in_indented = False
  for number, line in enumerate(text.split("\n"), 1):
    stripped = line.strip()
    marker = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
    if fence:
      if marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
        fence = None
      continue
    if marker:
      fence = marker.group(1)
      continue
    if line.startswith("    ") and (previous_blank or in_indented) and stripped:
      in_indented = True
      continue
    if stripped:
      in_indented = False
    previous_blank = not stripped
    yield number, re.sub(r"`[^`]*`", "", line)


def slug(heading):
  """GitHub's anchor for a heading's text (before the -1, -2 of repeats)."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
  text = re.sub(r"[^\w\- ]", "", text.lower())
  return text.replace(" ", "-")


def anchors(text):
  """Every anchor the headings of a Markdown text give, repeats numbered as GitHub does."""
  seen = {}
  found = set()
  for _, line in _prose_lines(text):
    match = _HEADING.match(line)
    if not match:
      continue
    base = slug(match.group(2))
    count = seen.get(base, 0)
    seen[base] = count + 1
    found.add(base if count == 0 else f"{base}-{count}")
  return found


def broken_links(path):
  """The relative links of one Markdown file that point nowhere, as readable lines."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  bad = []
  for number, line in _prose_lines(text):
    for target in _LINK.findall(line):
      if _EXTERNAL.match(target):
        continue
      file_part, _, anchor = target.partition("#")
      where = f"{os.path.relpath(path, REPO_ROOT)}:{number}: {target}"
      linked = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                if file_part else path)
      if not os.path.exists(linked):
        bad.append(f"{where}: no file {os.path.relpath(linked, REPO_ROOT)}")
        continue
      if anchor and linked.endswith(".md"):
        with open(linked, encoding="utf-8") as f:
          if anchor not in anchors(f.read()):
            bad.append(f"{where}: no heading with anchor #{anchor}")
  return bad


def _documents():
  paths = glob.glob(os.path.join(REPO_ROOT, "*.md")) + glob.glob(
      os.path.join(REPO_ROOT, "docs", "*.md"))
  return sorted(paths)


def test_every_relative_link_in_the_documents_resolves():
  paths = _documents()
  names = {os.path.relpath(p, REPO_ROOT) for p in paths}
  assert {"README.md", "BUILD.md", "CONTRIBUTING.md", "docs/training.md",
          "docs/results.md"} <= names
  bad = [line for path in paths for line in broken_links(path)]
  assert not bad, "links that point nowhere:\n" + "\n".join(bad)


def test_build_md_links_every_topic_page():
  with open(os.path.join(REPO_ROOT, "BUILD.md"), encoding="utf-8") as f:
    build = f.read()
  pages = sorted(os.path.relpath(p, REPO_ROOT)
                 for p in glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))
  assert pages, "no topic pages in docs/"
  missing = [page for page in pages if f"]({page})" not in build]
  assert not missing, f"topic pages BUILD.md does not link: {missing}"


def test_slugs_follow_github():
  assert slug("Several hosts (multi-worker)") == "several-hosts-multi-worker"
  assert slug("Model directories on gs://") == "model-directories-on-gs"
  assert slug("tools/query_serving.py") == "toolsquery_servingpy"
  assert slug("The paper's configurations") == "the-papers-configurations"
  assert slug("Fourth run (2026-11-25): the words in the target") == (
      "fourth-run-2026-11-25-the-words-in-the-target")
  assert anchors("# A\n## A\n    # not a heading\n```\n# nor this\n```\n") == {"a", "a-1"}


def test_the_check_finds_broken_files_and_anchors(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Some section\n", encoding="utf-8")
  (tmp_path / "image.png").write_bytes(b"")
  doc = tmp_path / "doc.md"
  doc.write_text(
      "# Doc\n\n"
      "[ok](docs/page.md#some-section) [ok](#doc) ![ok](image.png) [web](https://x.org/a)\n"
      "[gone](docs/missing.md) [no anchor](docs/page.md#other) [self](#nowhere)\n"
      "`[code](not/checked.md)`\n\n    [indented code](not/checked.md)\n",
      encoding="utf-8")
  bad = broken_links(str(doc))
  assert len(bad) == 3, bad
  assert "no file" in bad[0] and "missing.md" in bad[0]
  assert "#other" in bad[1] and "#nowhere" in bad[2]


def python_blocks(path):
  """The ```python code blocks of a Markdown file, in order."""
  with open(path, encoding="utf-8") as f:
    return re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)


def test_the_python_api_page_runs_and_agrees_with_the_commands(tiny_model_dir, tmp_path):
  """docs/python_api.md's blocks, run in order on the tiny model, print the
  translations `decode` writes and the line `score` writes for the same input."""
  code = "\n".join(python_blocks(os.path.join(REPO_ROOT, "docs", "python_api.md")))
  assert code.count('model_dir = "runs/multi30k"') == 1, "the page's model directory"
  code = code.replace('"runs/multi30k"', repr(tiny_model_dir))
  printed, namespace = io.StringIO(), {}
  with contextlib.redirect_stdout(printed):
    exec(compile(code, "docs/python_api.md", "exec"), namespace)  # pylint: disable=exec-used
  lines = printed.getvalue().splitlines()
  assert lines[0] == f"loaded {os.path.join(tiny_model_dir, 'ckpt-7')}", lines
  sentences, results = namespace["sentences"], namespace["results"]
  assert lines[1:3] == [f"{s} -> {r.texts[0]} ({r.scores[0]:.4f})"
                        for s, r in zip(sentences, results)], lines

  (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
  decoded = inprocess.run("decode", f"--model_dir={tiny_model_dir}",
                          f"--input_file={tmp_path / 'src.txt'}", "--beam_size=4",
                          "--alpha=0.6", "--extra_decode_length=50")
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  assert decoded.stdout.splitlines() == [r.texts[0] for r in results]

  (tmp_path / "pair.src").write_text(namespace["source"] + "\n", encoding="utf-8")
  (tmp_path / "pair.tgt").write_text(namespace["target"] + "\n", encoding="utf-8")
  scored = inprocess.run("score", f"--model_dir={tiny_model_dir}",
                         f"--source_file={tmp_path / 'pair.src'}",
                         f"--target_file={tmp_path / 'pair.tgt'}")
  assert scored.returncode == 0, scored.stderr[-3000:]
  assert scored.stdout.splitlines() == [lines[3]], (scored.stdout, lines)
