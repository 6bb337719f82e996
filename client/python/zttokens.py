"""Token files (proto/zt_tokens.h, docs/spec.md "Token files") written from Python, standard
library only; ztclient re-exports these.

    import ztclient
    ztclient.write_tokens("train.tok", [[1, 2, 3], {"input_ids": [4, 5, 6], "labels": [-100, 5, 6]}])
    docs = ztclient.chat_documents(tokenizer, examples)   # a Hugging Face tokenizer, chat examples
    ztclient.write_tokens("sft.tok", docs, vocab=len(tokenizer))

A document is a list of token ids (every token but the first a target) or a dict with
"input_ids" and either "labels" (transformers' convention: aligned with input_ids, the shift done
by the trainer, -100 = not a target) or "loss_mask" (1 = a target). ztd packs documents into rows
(data.packing) and counts in the loss only the targets whose bit is set.
"""
import operator
import os
import struct

__all__ = ["write_tokens", "chat_documents", "IGNORE_INDEX"]

IGNORE_INDEX = -100
_MAGIC = b"ZTTOKENS"
_VERSION = 2


def _document(i, doc, vocab):
    """(ids, counted) of document i, checked; ValueError naming the document and index."""
    if isinstance(doc, dict):
        ids = list(doc.get("input_ids") or [])
        labels, mask = doc.get("labels"), doc.get("loss_mask")
        if labels is not None and mask is not None:
            raise ValueError(f"document {i}: labels and loss_mask both given; give one")
    else:
        ids, labels, mask = list(doc), None, None
    if not ids:
        raise ValueError(f"document {i}: input_ids must be a non-empty list of token ids")
    for j, t in enumerate(ids):
        try:
            ids[j] = t = operator.index(t)  # numpy's integers too
        except TypeError:
            t = -1
        if t < 0 or (vocab is not None and t >= vocab):
            want = f"an integer in [0, {vocab})" if vocab is not None else "a non-negative integer"
            raise ValueError(f"document {i}: input_ids[{j}] is not {want}")
    given = labels if labels is not None else mask
    if given is not None and len(given) != len(ids):
        name = "labels" if labels is not None else "loss_mask"
        raise ValueError(f"document {i}: {name} has {len(given)} entries, input_ids {len(ids)}")
    if labels is not None:
        for j, (t, y) in enumerate(zip(ids, labels)):
            if y != IGNORE_INDEX and y != t:
                raise ValueError(f"document {i}: labels[{j}] is neither -100 nor input_ids[{j}]")
        counted = [y != IGNORE_INDEX for y in labels]
    elif mask is not None:
        for j, m in enumerate(mask):
            if m not in (0, 1):
                raise ValueError(f"document {i}: loss_mask[{j}] is neither 0 nor 1")
        counted = [m == 1 for m in mask]
    else:
        counted = [True] * len(ids)
    counted[0] = False  # nothing predicts a document's first token
    return ids, counted


def _pad8(n):
    return b"\0" * (-n % 8)


def write_tokens(path, docs, vocab=None):
    """Writes docs (an iterable of documents, see the module's text) as a version 2 token file
    at path, through a temporary file and a rename. vocab: the vocabulary (an id >= vocab is
    refused); None: the largest id + 1. Returns {"documents", "tokens", "targets", "vocab"}."""
    ids, bits, starts = [], bytearray(), [0]
    targets = 0
    for i, doc in enumerate(docs):
        d, counted = _document(i, doc, vocab)
        ids.extend(d)
        targets += sum(counted)
        starts.append(len(ids))
        bits.extend(counted)
    if not ids:
        raise ValueError("no document to write")
    v = vocab if vocab is not None else max(ids) + 1
    width = 2 if v <= 65536 else 4
    mask = bytearray((len(ids) + 7) // 8)
    for j, b in enumerate(bits):
        if b:
            mask[j // 8] |= 1 << (j % 8)
    header = _MAGIC + struct.pack("<IIII", _VERSION, width, v, 0)
    header += struct.pack("<QQQ", len(ids), len(starts) - 1, 0)
    tokens = struct.pack(f"<{len(ids)}{'H' if width == 2 else 'I'}", *ids)
    tmp = f"{os.fspath(path)}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(tokens + _pad8(len(tokens)))
            f.write(bytes(mask) + _pad8(len(mask)))
            f.write(struct.pack(f"<{len(starts)}Q", *starts))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"documents": len(starts) - 1, "tokens": len(ids), "targets": targets, "vocab": v}


def _ids(encoded):
    # transformers 4 returns a list from apply_chat_template(tokenize=True), 5 a BatchEncoding
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    return list(encoded)


def chat_documents(tokenizer, examples, target_roles=("assistant",)):
    """Documents ({"input_ids", "labels"}) from chat examples (each a list of {"role",
    "content"} messages, or a dict with "messages"), rendered by tokenizer.apply_chat_template
    (a transformers tokenizer with a chat template): the tokens of each message whose role is in
    target_roles are targets; everything else (system and user turns, the template's prompt for
    the reply) is not. The template must render a conversation's prefix as a prefix of the
    whole (true of the common templates); ValueError names the example and message where not."""
    docs = []
    for i, ex in enumerate(examples):
        msgs = ex["messages"] if isinstance(ex, dict) else ex
        ids, labels = [], []
        for k, msg in enumerate(msgs):
            target = msg["role"] in target_roles
            if target:
                # the reply's header (the generation prompt) belongs to the prompt
                head = _ids(tokenizer.apply_chat_template(msgs[:k], tokenize=True,
                                                          add_generation_prompt=True))
                if head[:len(ids)] != ids:
                    raise ValueError(f"example {i}: message {k}: the template does not render "
                                     "the conversation before it as its prefix")
                labels.extend([IGNORE_INDEX] * (len(head) - len(ids)))
                ids = head
            full = _ids(tokenizer.apply_chat_template(msgs[:k + 1], tokenize=True))
            if full[:len(ids)] != ids:
                raise ValueError(f"example {i}: message {k}: the template does not render the "
                                 "conversation before it as its prefix")
            new = full[len(ids):]
            labels.extend(new if target else [IGNORE_INDEX] * len(new))
            ids = full
        docs.append({"input_ids": ids, "labels": labels})
    return docs
