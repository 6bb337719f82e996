"""ztclient.chat_documents with a real Hugging Face tokenizer: a byte-level BPE trained here on a
local text, given a chat template, renders chat examples; the assistant turns (and their end
token) are the targets, the rest is masked; write_tokens stores exactly those masks (read back
from the file's bytes). Writes OUT.tok and prints its vocabulary for the job that trains on it.
Usage: chat_template.py TEXT OUT.tok"""
import struct
import sys

import zttokens
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

text, out = sys.argv[1], sys.argv[2]
specials = ["<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
bpe = Tokenizer(models.BPE(unk_token="<unk>"))
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(open(text, encoding="utf-8").read().splitlines(),
                        trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", eos_token="<|end|>")
tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
                     "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")

examples = [
    [{"role": "user", "content": "What is this licence?"},
     {"role": "assistant", "content": "The GNU General Public License."}],
    {"messages": [{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": "May I copy it?"},
                  {"role": "assistant", "content": "Yes, verbatim copies."},
                  {"role": "user", "content": "And change it?"},
                  {"role": "assistant", "content": "Changing it is not allowed."}]},
] * 20
docs = zttokens.chat_documents(tok, examples)
assert len(docs) == 40
for i, (ex, d) in enumerate(zip(examples, docs)):
    msgs = ex["messages"] if isinstance(ex, dict) else ex
    ids, labels = d["input_ids"], d["labels"]
    whole = tok.apply_chat_template(msgs, tokenize=True)
    whole = list(whole["input_ids"]) if hasattr(whole, "keys") else list(whole)
    assert len(ids) == len(labels) and ids == whole, i
    # the targets, run by run: each assistant reply and its end token, nothing else
    runs, cur = [], []
    for t, y in zip(ids, labels):
        if y == -100:
            if cur:
                runs.append(cur)
            cur = []
        else:
            assert y == t, (i, y, t)
            cur.append(t)
    if cur:
        runs.append(cur)
    want = [m["content"] + "<|end|>" for m in msgs if m["role"] == "assistant"]
    got = [tok.decode(r) for r in runs]
    assert got == want, (i, got, want)
    masked = tok.decode([t for t, y in zip(ids, labels) if y == -100])
    assert "<|assistant|>" in masked and all(m["content"] in masked for m in msgs
                                             if m["role"] != "assistant"), masked

info = zttokens.write_tokens(out, docs, vocab=len(tok))
raw = open(out, "rb").read()
magic, version, width, vocab, _, n_tok, n_docs, _ = struct.unpack_from("<8sIIIIQQQ", raw)
assert (magic, version, vocab, n_docs) == (b"ZTTOKENS", 2, len(tok), 40), (magic, version, vocab)
mask_at = 48 + (n_tok * width + 7) // 8 * 8
flat = [y for d in docs for y in d["labels"]]
bits = [raw[mask_at + j // 8] >> (j % 8) & 1 for j in range(n_tok)]
first = set()
at = 0
for d in docs:
    first.add(at)
    at += len(d["input_ids"])
assert bits == [0 if j in first else int(flat[j] != -100) for j in range(n_tok)], "mask bits"
assert info["targets"] == sum(bits), info
print("chat_template: %d documents, %d tokens, %d targets, vocab %d" % (
    info["documents"], info["tokens"], info["targets"], info["vocab"]))
print(info["vocab"])
