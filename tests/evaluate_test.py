"""BLEU/chrF through sacreBLEU, and the evaluate CLI's output and errors."""


import pytest
import sacrebleu

from t2t_keras import metrics
from tests import inprocess

REFS = ["A man is riding a bike .", "Two dogs play in the snow .", "The girl smiles ."]
HYPS = ["a man is riding a bike .", "Two dogs are playing in snow .", "The girl smiles"]


def test_perfect_hypothesis_scores_100():
  report = metrics.bleu_report(REFS, [REFS])
  assert report["bleu"] == pytest.approx(100.0)
  assert report["bleu_uncased"] == pytest.approx(100.0)
  assert report["chrf"] == pytest.approx(100.0)
  assert report["bleu_signature"].startswith("nrefs:1|case:mixed")
  assert "case:lc" in report["bleu_uncased_signature"]
  assert report["chrf_signature"].startswith("nrefs:1|case:mixed")


def test_matches_sacrebleu_directly():
  report = metrics.bleu_report(HYPS, [REFS])
  assert 0 < report["bleu"] < 100
  assert report["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
  assert report["bleu_uncased"] == pytest.approx(
      sacrebleu.corpus_bleu(HYPS, [REFS], lowercase=True).score)
  assert report["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
  direct = sacrebleu.corpus_bleu(HYPS, [REFS])
  assert report["length_ratio"] == pytest.approx(direct.sys_len / direct.ref_len)
  assert report["length_ratio"] < 1  # "The girl smiles" drops its period
  # Two reference streams: each hypothesis may match either.
  other = ["A man rides a bike .", "Two dogs are playing in snow .", "The girl smiles"]
  both = metrics.bleu_report(HYPS, [REFS, other])
  assert both["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS, other]).score)
  assert both["bleu"] > report["bleu"] and both["bleu_signature"].startswith("nrefs:2")


def test_uncased_ignores_case_and_cased_does_not():
  shouted = [r.upper() for r in REFS]
  report = metrics.bleu_report(shouted, [REFS])
  assert report["bleu_uncased"] == pytest.approx(100.0)
  assert report["bleu"] < 50.0
  assert metrics.bleu_report(shouted, [REFS], lowercase_chrf=True)["chrf"] == \
      pytest.approx(100.0)
  assert report["chrf"] < 100.0


def test_misaligned_references_are_refused():
  with pytest.raises(ValueError, match="reference stream 1 has 2 segments but there are "
                     "3 hypotheses"):
    metrics.bleu_report(HYPS, [REFS, REFS[:2]])
  with pytest.raises(ValueError, match="no hypotheses"):
    metrics.bleu_report([], [[]])


def evaluate(*args):
  """`python -m t2t_keras.evaluate ARGS`, its main in this process (tests/inprocess.py;
  tests/parsing_test.py's recipe test starts it as a process)."""
  return inprocess.run("evaluate", *args)


def write(path, lines):
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def test_cli_prints_scores_with_signatures(tmp_path):
  hyp, ref = write(tmp_path / "hyp.txt", HYPS), write(tmp_path / "ref.txt", REFS)
  ok = evaluate(f"--hypotheses={hyp}", f"--references={ref}")
  assert ok.returncode == 0, ok.stderr[-2000:]
  report = metrics.bleu_report(HYPS, [REFS])
  lines = ok.stdout.splitlines()
  assert lines[0] == f"BLEU {report['bleu']:.2f} ({report['bleu_signature']})"
  assert lines[1].startswith(f"BLEU uncased {report['bleu_uncased']:.2f} (nrefs:1|case:lc|")
  assert lines[2].startswith(f"chrF {report['chrf']:.2f} (nrefs:1|case:mixed|")
  assert "BP = " in ok.stdout  # sacreBLEU's details follow
  lowercased = evaluate(f"--hypotheses={hyp}", f"--references={ref}",
                        f"--references={ref}", "--lowercase")
  assert lowercased.returncode == 0, lowercased.stderr[-2000:]
  assert "chrF" in lowercased.stdout and "(nrefs:2|case:lc|eff:yes|nc:6" in lowercased.stdout


def test_cli_refuses_misaligned_and_undecodable_files(tmp_path):
  hyp, short = write(tmp_path / "hyp.txt", REFS), write(tmp_path / "short.txt", REFS[:1])
  bad = evaluate(f"--hypotheses={hyp}", f"--references={short}")
  assert bad.returncode == 1
  assert (f"error: --references {short} has 1 lines but --hypotheses {hyp} has 3"
          in bad.stderr)
  assert "Traceback" not in bad.stderr and not bad.stdout
  latin1 = tmp_path / "latin1.txt"
  latin1.write_bytes(b"fine\nstra\xdfe\nok\n")
  bad = evaluate(f"--hypotheses={latin1}", f"--references={hyp}")
  assert bad.returncode == 1
  assert f"error: --hypotheses {latin1} line 2 is not valid UTF-8" in bad.stderr
  assert "Traceback" not in bad.stderr
  bad = evaluate(f"--hypotheses={tmp_path / 'missing.txt'}", f"--references={hyp}")
  assert bad.returncode == 1 and "missing.txt cannot be read" in bad.stderr
