"""A word-level tokenizer with a fixed, self-contained vocabulary (no files, no downloads)."""

from __future__ import annotations

import zlib

_COMMON_TEXT = (
    "the of and to a in is it you that he was for on are with as i his they be at one have this from "
    "or had by word but what some we can out other were all there when up use your how said an each "
    "she which do their time if will way about many then them write would like so these her long make "
    "thing see him two has look more day could go come did number sound no most people my over know "
    "water than call first who may down side been now find any new work part take get place made live "
    "where after back little only round man year came show every good me give our under name very "
    "through just form sentence great think say help low line differ turn cause much mean before move "
    "right boy old too same tell does set three want air well also play small end put home read hand "
    "port large spell add even land here must big high such follow act why ask men change went light "
    "kind off need house picture try us again animal point mother world near build self earth father "
    "repeat story hello question answer please model token output"
)
_COMMON = _COMMON_TEXT.split()
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")


def _vocabulary(size: int) -> list[str]:
    words = list(SPECIAL_TOKENS) + list(dict.fromkeys(_COMMON))
    seen = set(words)
    for c1 in _CONSONANTS:
        for v1 in _VOWELS:
            for c2 in _CONSONANTS:
                for v2 in _VOWELS:
                    word = c1 + v1 + c2 + v2
                    if len(words) >= size:
                        return words
                    if word not in seen:
                        words.append(word)
                        seen.add(word)
    return words


class WordTokenizer:
    """Whitespace words; an unknown word maps to a stable vocabulary slot (crc32), never fails."""

    def __init__(self, vocab_size: int) -> None:
        self.words = _vocabulary(vocab_size)
        self.ids = {w: i for i, w in enumerate(self.words)}
        self.eos_token_id = self.ids["<eos>"]

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.lower().split():
            token = self.ids.get(word)
            if token is None:
                token = len(SPECIAL_TOKENS) + zlib.crc32(word.encode()) % (len(self.words) - len(SPECIAL_TOKENS))
            ids.append(token)
        return ids

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids if 0 <= i < len(self.words) and i >= len(SPECIAL_TOKENS))
