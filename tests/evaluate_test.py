"""BLEU/chrF through sacreBLEU, and the evaluate CLI's errors."""

import subprocess
import sys

import pytest
import sacrebleu

from t2t_keras import metrics
from tests.conftest import REPO_ROOT

REFS = ["A man is riding a bike .", "Two dogs play in the snow .", "The girl smiles ."]


def test_perfect_hypothesis_scores_100():
  report = metrics.bleu_report(REFS, [REFS])
  assert report["bleu"] == pytest.approx(100.0)
  assert report["bleu_uncased"] == pytest.approx(100.0)
  assert report["chrf"] == pytest.approx(100.0)
  assert report["bleu_signature"].startswith("nrefs:1|case:mixed")
  assert "case:lc" in report["bleu_uncased_signature"]


def test_matches_sacrebleu_and_case_matters():
  hyps = ["a man is riding a bike .", "Two dogs are playing in snow .", "The girl smiles"]
  report = metrics.bleu_report(hyps, [REFS])
  assert report["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [REFS]).score)
  assert report["bleu_uncased"] > report["bleu"]


def test_cli_prints_signatures_and_refuses_misaligned_files(tmp_path):
  hyp, ref, short = tmp_path / "hyp.txt", tmp_path / "ref.txt", tmp_path / "short.txt"
  hyp.write_text("\n".join(REFS) + "\n", encoding="utf-8")
  ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
  short.write_text(REFS[0] + "\n", encoding="utf-8")
  ok = subprocess.run([sys.executable, "-m", "t2t_keras.evaluate", f"--hypotheses={hyp}",
                       f"--references={ref}"], capture_output=True, text=True,
                      cwd=REPO_ROOT, timeout=300, check=False)
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert "BLEU 100.00 (nrefs:1|case:mixed" in ok.stdout and "chrF 100.00" in ok.stdout
  bad = subprocess.run([sys.executable, "-m", "t2t_keras.evaluate", f"--hypotheses={hyp}",
                        f"--references={short}"], capture_output=True, text=True,
                       cwd=REPO_ROOT, timeout=300, check=False)
  assert bad.returncode == 1
  assert f"{short} has 1 lines but --hypotheses {hyp} has 3" in bad.stderr
  assert "Traceback" not in bad.stderr
