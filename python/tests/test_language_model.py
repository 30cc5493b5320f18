"""The language models from Python: create_model("lm_tiny") is the C++ model (its names and
initialisation), it is causal, its decoding steps equal its forward, and a checkpoint trained by
`convnn train` generates the same text from Python as `convnn generate` does (one sampling rule,
convnn::sample_tokens)."""
import os
import subprocess

import pytest
import torch

import convnn.models as models
from cli_support import BINARY

VARIANTS = [dict(attention="mhsa"), dict(attention="mhsa", num_kv_heads=1), dict(attention="convnn", k=5),
            dict(attention="convnn", k=5, num_kv_heads=1), dict(attention="kvt", k=5)]


def small(**options):
    return models.create_model("lm_tiny", num_classes=50, embed_dim=32, depth=2, num_heads=2, context=24, **options)


@pytest.mark.parametrize("options", VARIANTS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
def test_no_position_sees_a_later_token_and_steps_equal_the_forward(options):
    model = small(**options).double().eval()
    tokens = torch.randint(0, 50, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 50
    with torch.no_grad():
        full = model(tokens)
        assert full.shape == (2, 20, 50)
        assert torch.equal(model(changed)[:, :12], full[:, :12])
        caches = model.make_caches(2)
        steps = [model.forward_step(tokens[:, :7], caches)]
        steps += [model.forward_step(tokens[:, i:i + 1], caches) for i in range(7, 20)]
    # float64: the step adds the same terms in another order.
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-12)
    assert caches[0].lengths == [20, 20]


def test_a_sequence_shorter_than_k_gives_the_prefix_of_a_longer_ones_logits():
    model = small(attention="convnn", k=8).eval()
    tokens = torch.randint(0, 50, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens[:, :3]), model(tokens)[:, :3])


def test_names_and_initialisation_are_the_cpp_models():
    torch.manual_seed(0)
    model = small(attention="convnn", k=5)
    names = set(model.state_dict())
    assert {"token_embed.weight", "pos_embed", "blocks.0.attn.kernel", "blocks.1.attn.query_projection.weight",
            "norm.weight", "head.weight"} <= names
    torch.manual_seed(0)  # C++ draws the initialisation from torch's generator
    assert torch.equal(small(attention="convnn", k=5).state_dict()["head.weight"], model.state_dict()["head.weight"])
    twin = small(attention="mhsa")
    assert "blocks.0.attn.qkv.weight" in twin.state_dict()
    # The twin's size: the same but for ConvNN's depthwise kernel (d x K per block).
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in twin.parameters()) == 2 * 16 * 5


def test_generate_is_seeded_and_greedy_takes_the_most_likely_token():
    model = small(attention="convnn", k=5).eval()
    prompt = torch.randint(0, 50, (2, 3))
    a = model.generate(prompt, 30, seed=4)  # past the context of 24: the caches restart
    assert a.shape == (2, 33) and torch.equal(a[:, :3], prompt)
    assert torch.equal(model.generate(prompt, 30, seed=4), a)
    assert not torch.equal(model.generate(prompt, 30, seed=5), a)
    greedy = model.generate(prompt, 10, temperature=0)
    with torch.no_grad():
        for n in range(3, 13):
            assert torch.equal(greedy[:, n], model(greedy[:, :n])[:, -1].argmax(-1))


def test_bad_arguments_are_refused_by_name():
    model = small(attention="mhsa")
    # The C++ model's rule (convnn::language_model_check_tokens), ids included: an id past the
    # vocabulary had reached the embedding, whose IndexError named no argument.
    with pytest.raises(RuntimeError, match=r"tokens must be int64 \[B, T\]"):
        model(torch.zeros(1, 3))
    with pytest.raises(RuntimeError, match="tokens at positions 0 to 29 are past the context of 24 tokens"):
        model(torch.zeros(1, 30, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"tokens must be token ids in \[0, vocab_size = 50\), got values in \[-1, 3\]"):
        model(torch.tensor([[3, -1]]))
    with pytest.raises(RuntimeError, match=r"prompts must be token ids in \[0, vocab_size = 50\), got values in \[0, 50\]"):
        model.generate(torch.tensor([[0, 50]]), 3)
    caches = model.make_caches(1)
    model.forward_step(torch.zeros(1, 20, dtype=torch.long), caches)
    with pytest.raises(RuntimeError, match="tokens at positions 20 to 24 are past the context of 24 tokens"):
        model.forward_step(torch.zeros(1, 5, dtype=torch.long), caches)
    # A str prompt is its UTF-8 bytes: refused before sampling by a model whose ids may pass 255.
    with pytest.raises(ValueError, match="a str prompt is read as UTF-8 bytes .* this one's vocab_size is 300"):
        models.create_model("lm_tiny", num_classes=300, embed_dim=32, depth=1, num_heads=2, context=24,
                            attention="mhsa").generate("ab", 3)
    with pytest.raises(RuntimeError, match=r"temperature must be >= 0 \(0: the most likely token\), got -1"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 3, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), -1)


def test_a_language_model_reads_bytes_unless_told_otherwise():
    # num_classes unset is the model's own: 256 byte tokens for a language model (it had been the
    # image models' 1000, so that a str prompt was refused), 1000 ImageNet classes for the others.
    model = models.create_model("lm_tiny", embed_dim=32, depth=1, num_heads=2, context=24, attention="mhsa")
    assert model.vocab_size == 256 and model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 256)
    text = model.eval().generate("ab", 3, seed=1)
    assert isinstance(text, str) and text.startswith("ab")
    assert models.create_model("resnet18", width=8).num_classes == 1000


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    if not os.path.exists(BINARY):
        pytest.skip(f"the convnn command is not built ({BINARY})")
    root = tmp_path_factory.mktemp("lm")
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "tiny").write_text("".join(f"fortune number {i} says hello.\n%\n" for i in range(120)))
    subprocess.run([BINARY, "train", "--model", "lm_tiny", "--attention", "convnn", "--k", "4", "--embed-dim", "32",
                    "--depth", "1", "--num-heads", "2", "--context", "32", "--dataset", "fortunes", "--data-dir",
                    str(corpus), "--epochs", "1", "--batch-size", "8", "--smoothing", "0", "--warmup-epochs", "0",
                    "--output", str(root / "runs"), "--experiment", "run", "--quiet", "--no-plots"],
                   check=True, capture_output=True, env={**os.environ, "CONVNN_NUM_THREADS": "1"})
    return root / "runs" / "run"


@pytest.mark.parametrize("sampling", [["--temperature", "0"], ["--temperature", "0.8", "--top-k", "5", "--seed", "3"]],
                         ids=["greedy", "sampled"])
def test_python_generates_the_text_convnn_generate_does(trained_run, sampling):
    result = subprocess.run([BINARY, "generate", "--checkpoint", str(trained_run), "--prompt", "fortune ", "-n", "40",
                             *sampling], check=True, capture_output=True, text=True)
    model = models.load_checkpoint(trained_run / "checkpoint-latest.pt")
    options = dict(zip(sampling[::2], sampling[1::2]))
    text = model.generate("fortune ", 40, temperature=float(options["--temperature"]),
                          top_k=int(options.get("--top-k", 0)), seed=int(options.get("--seed", 0)))
    assert result.stdout == text + "\n"
    assert text.startswith("fortune ")


def test_convnn_eval_reports_bits_per_token_and_draws_the_byte_confusion_matrix(trained_run, tmp_path):
    result = subprocess.run([BINARY, "eval", "--checkpoint", str(trained_run), "--output", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "tokens): top-1" in result.stdout and "bits/token)" in result.stdout
    assert (tmp_path / "confusion.csv").exists()
    if subprocess.run(["which", "gnuplot"], capture_output=True).returncode == 0:
        assert (tmp_path / "confusion.png").exists()


def test_compiled_whole_the_model_equals_eager_and_refuses_ids_past_the_vocabulary():
    # fullgraph: the id check goes in the graph as an assertion (traced tokens have no values to read);
    # without it, Inductor's embedding aborted the process on an id past the vocabulary.
    model = models.create_model("lm_tiny", num_classes=50, embed_dim=32, depth=1, num_heads=2, context=24).eval()
    compiled = torch.compile(model, fullgraph=True)
    tokens = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens), model(tokens))
        with pytest.raises(RuntimeError, match=r"tokens must be token ids in \[0, vocab_size = 50\)"):
            compiled(torch.full((2, 12), 50))
