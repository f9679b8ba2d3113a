#!/usr/bin/env python3
"""Training text, held-out slice and tokenizer of the default model (models/default).

Sources (Debian packages, nothing downloaded; scripts/install-deps.sh --model-data installs them):
  * python3.11-doc: the reST sources of the Python 3.11 documentation
    (/usr/share/doc/python3.11/html/_sources, PSF License Version 2), reduced to prose: code
    and literal blocks, directives without prose, and markup are removed.
  * linux-doc-6.1: the Linux kernel's Documentation/ (reST, GPL-2.0), translations left out,
    reduced the same way.
  * bible-kjv: the King James Version (public domain), printed verse by verse by `bible`.

Documents: one per Python documentation page and one per Bible chapter. A few chat turns in
the DeepSeek-V3 template's format are added (a section title asked about, its first paragraph
answered; a verse given, the next one answered) so that chat prompts get prose back.

Writes into OUT (default build/default_model_data):
  tokenizer.json        byte-level BPE trained with HF `tokenizers` on the training text
  train_tokens.npy      uint16 token ids of the training documents, each <bos> text <eos>
  heldout.txt           the held-out documents (never trained on), plain text
  heldout_tokens.npy    the same, tokenized like the training documents
  data_summary.json     sizes, counts, sources
"""
import argparse
import gzip
import json
import pathlib
import random
import re
import subprocess

import numpy as np

PYDOC_ROOT = pathlib.Path("/usr/share/doc/python3.11/html/_sources")
KERNEL_DOC_ROOT = pathlib.Path("/usr/share/doc/linux-doc-6.1/Documentation")
SEED = 20
VOCAB_SIZE = 4096
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
# DeepSeek-V3's template markers, so that its chat template renders onto single tokens.
SPECIAL_TOKENS = [BOS, EOS, "<｜▁pad▁｜>", USER, ASSISTANT, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                  "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>",
                  "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"]
# Held out: whole documents, chosen before training.
HELDOUT_PYDOC = {"tutorial/controlflow.rst.txt", "howto/sorting.rst.txt", "process/code-of-conduct.rst"}
HELDOUT_BOOKS = {"Ruth", "Jonah"}

# Directives whose body is prose (kept, dedented); all others are dropped with their body.
PROSE_DIRECTIVES = {"note", "warning", "seealso", "versionadded", "versionchanged", "deprecated", "tip",
                    "important", "impl-detail", "attention", "function", "method", "class", "attribute",
                    "data", "exception", "decorator", "describe", "classmethod", "staticmethod", "module",
                    "opcode", "cmdoption", "envvar", "glossary", "topic", "rubric", "admonition",
                    "abstractmethod", "coroutinefunction", "coroutinemethod", "pdbcommand", "c:function",
                    "c:macro", "c:type", "c:member", "c:var", "c:struct"}
SIGNATURE_DIRECTIVES = {"function", "method", "class", "attribute", "data", "exception", "decorator",
                        "classmethod", "staticmethod", "abstractmethod", "coroutinefunction", "coroutinemethod"}

ROLE = re.compile(r":[a-zA-Z:+-]+:`~?([^`<]*?)\s*(<[^>]*>)?`")
LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_+")
LITERAL = re.compile(r"``(.+?)``")
EMPHASIS = re.compile(r"\*\*?([^*\s][^*]*?)\*\*?")
UNDERLINE = re.compile(r"^([=\-~^\"'`#*+:.<>_])\1{2,}\s*$")


def clean_inline(text):
    # :func:`~os.path.join` shows "join", :func:`os.path.join` the whole name.
    text = ROLE.sub(lambda m: m.group(1).split(".")[-1] if "`~" in m.group(0) else m.group(1), text)
    text = LINK.sub(r"\1", text)
    text = LITERAL.sub(r"\1", text)
    text = EMPHASIS.sub(r"\1", text)
    text = re.sub(r"`([^`]+)`_*", r"\1", text)
    text = text.replace("|", "").replace("\\", "")
    return re.sub(r"\s+", " ", text).strip()


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


def skip_block(lines, i, base):
    """Index of the first line after the block indented deeper than `base` starting at i."""
    while i < len(lines) and (not lines[i].strip() or indent_of(lines[i]) > base):
        i += 1
    return i


class RstReader:
    """Reduces a reST page to its prose: items ("title", t) and ("para", t) in page order."""

    def __init__(self, source):
        self.lines, self.items, self.para, self.i = source.splitlines(), [], [], 0

    def flush(self):
        """Ends the current paragraph; True if it announced a literal block ("::")."""
        if not self.para:
            return False
        text = clean_inline(" ".join(self.para))
        literal = text.endswith("::")
        text = text[:-1] if literal else text
        if text.strip(": ") and re.search(r"[a-zA-Z]{2}", text):
            self.items.append(("para", text.rstrip(":") + (":" if literal and not text.endswith(":") else "")))
        self.para.clear()
        return literal

    def blank(self, base):
        literal = self.flush()
        self.i += 1
        if literal:  # a literal block follows "::"
            lines = self.lines
            while self.i < len(lines) and not lines[self.i].strip():
                self.i += 1
            deeper = self.i < len(lines) and indent_of(lines[self.i]) > base
            self.i = skip_block(lines, self.i, base - 1 if deeper else base)

    def directive(self, stripped, base):
        self.flush()
        m = re.match(r"\.\. ([a-zA-Z:-]+)::\s*(.*)$", stripped)
        name = m.group(1) if m else ""
        if name not in PROSE_DIRECTIVES:
            self.i = skip_block(self.lines, self.i + 1, base)
            return
        if name in SIGNATURE_DIRECTIVES and m.group(2):
            self.items.append(("para", clean_inline(m.group(2))))
        self.i += 1
        while (self.i < len(self.lines) and re.match(r"\s*:[a-z-]+:", self.lines[self.i])
               and indent_of(self.lines[self.i]) > base):
            self.i += 1  # directive options; the body follows as ordinary (indented) paragraphs

    def line(self, stripped, base):
        if stripped.startswith(("+-", "+=", "|")) or re.match(r"^=+( +=+)+$", stripped):  # tables
            self.flush()
            self.i += 1
        elif UNDERLINE.match(stripped):
            if len(self.para) == 1:
                self.items.append(("title", clean_inline(self.para.pop())))
            self.i += 1
        elif stripped.startswith(">>>"):
            self.flush()
            self.i = skip_block(self.lines, self.i + 1, base - 1)
        elif stripped.startswith(".."):
            self.directive(stripped, base)
        else:
            if re.match(r"[-*+] |\d+\. |#\. ", stripped):
                self.flush()
                stripped = re.sub(r"^([-*+]|\d+\.|#\.) ", "", stripped)
            self.para.append(stripped)
            self.i += 1

    def read(self):
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if line.strip():
                self.line(line.strip(), indent_of(line))
            else:
                self.blank(indent_of(line))
        self.flush()
        return self.items


def rst_paragraphs(source):
    """(kind, text) items of a reST page: ("title", t) or ("para", t)."""
    return RstReader(source).read()


def rst_sources():
    """(relative path, reST text) of the Python and kernel documentation, in a fixed order."""
    for path in sorted(PYDOC_ROOT.rglob("*.rst.txt")):
        yield str(path.relative_to(PYDOC_ROOT)), path.read_text(encoding="utf-8", errors="replace")
    for path in sorted(KERNEL_DOC_ROOT.rglob("*.rst*")):
        rel = str(path.relative_to(KERNEL_DOC_ROOT))
        if rel.startswith("translations/") or not (rel.endswith(".rst") or rel.endswith(".rst.gz")):
            continue
        data = gzip.decompress(path.read_bytes()) if rel.endswith(".gz") else path.read_bytes()
        yield rel.removesuffix(".gz"), data.decode("utf-8", errors="replace")


def pydoc_documents():
    """{relative path: (text, [(title, first paragraph)])} of the reST documentation."""
    docs = {}
    for rel, source in rst_sources():
        items = rst_paragraphs(source)
        text = "\n".join(t if kind == "para" else "\n" + t + "\n" for kind, t in items).strip()
        sections = [(items[k][1], items[k + 1][1]) for k in range(len(items) - 1)
                    if items[k][0] == "title" and items[k + 1][0] == "para" and len(items[k + 1][1]) > 80]
        if len(text) > 200:
            docs[rel] = (text, sections)
    return docs


BOOKS = ["Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
         "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
         "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
         "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah",
         "Haggai", "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
         "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
         "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James", "1 Peter",
         "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation"]


def kjv_chapters():
    """[(book, chapter, [verses])] from `bible -f` (one 'Ref verse' line per verse)."""
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True).stdout
    chapters, book_index, last_abbrev = [], -1, None
    for line in out.splitlines():
        m = re.match(r"(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        abbrev, chapter, verse, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()
        if abbrev != last_abbrev:
            book_index, last_abbrev = book_index + 1, abbrev
        if verse == 1 or not chapters or chapters[-1][1] != chapter:
            chapters.append((BOOKS[book_index], chapter, []))
        chapters[-1][2].append(text)
    assert book_index == len(BOOKS) - 1, f"expected {len(BOOKS)} books, found {book_index + 1}"
    return chapters


def chat_turn(question, answer):
    return f"{BOS}{USER}{question}{ASSISTANT}{answer}{EOS}"


def build_corpus():
    """(train documents, held-out documents, summary); train documents carry their markers."""
    rng = random.Random(SEED)
    train, heldout, chats = [], [], []
    for rel, (text, sections) in pydoc_documents().items():
        (heldout if rel in HELDOUT_PYDOC else train).append(text)
        if rel not in HELDOUT_PYDOC:
            for title, para in sections:
                question = rng.choice(["What is {}?", "Tell me about {}.", "Explain {}.", "{}?"]).format(title)
                chats.append(chat_turn(question, para))
    for book, chapter, verses in kjv_chapters():
        text = f"{book} {chapter}\n\n" + "\n".join(verses)
        (heldout if book in HELDOUT_BOOKS else train).append(text)
        if book not in HELDOUT_BOOKS:
            for k in rng.sample(range(len(verses) - 1), min(2, len(verses) - 1)):
                chats.append(chat_turn(rng.choice(["What comes after this verse? ", "Continue: ", ""]) + verses[k],
                                       verses[k + 1]))
    documents = [f"{BOS}{t}{EOS}" for t in train] + chats
    rng.shuffle(documents)
    summary = {"train_documents": len(train), "chat_turns": len(chats), "heldout_documents": len(heldout),
               "train_bytes": sum(len(d.encode()) for d in documents),
               "heldout_pydoc": sorted(HELDOUT_PYDOC), "heldout_books": sorted(HELDOUT_BOOKS)}
    return documents, heldout, summary


def train_tokenizer(documents, path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(documents, trainer=trainer)
    tok.save(str(path))
    return tok


def encode(tok, documents):
    ids = []
    for batch in range(0, len(documents), 1024):
        for enc in tok.encode_batch(documents[batch:batch + 1024], add_special_tokens=False):
            ids.extend(enc.ids)
    return np.asarray(ids, dtype=np.uint16)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="build/default_model_data")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    documents, heldout, summary = build_corpus()
    tok = train_tokenizer(documents, out / "tokenizer.json")
    train_ids = encode(tok, documents)
    heldout_text = "\n\n".join(heldout) + "\n"
    (out / "heldout.txt").write_text(heldout_text, encoding="utf-8")
    heldout_ids = encode(tok, [f"{BOS}{t}{EOS}" for t in heldout])
    np.save(out / "train_tokens.npy", train_ids)
    np.save(out / "heldout_tokens.npy", heldout_ids)
    summary.update(train_tokens=int(train_ids.size), heldout_tokens=int(heldout_ids.size),
                   heldout_bytes=len(heldout_text.encode()), vocab_size=tok.get_vocab_size())
    (out / "data_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
