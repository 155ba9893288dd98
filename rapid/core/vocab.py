"""Which tokenizer a side speaks: a fingerprint both ends compare at the handshake (torch-free).

    fingerprint = sha256( "id\\ttoken\\n" for every vocabulary entry by id ‖ "special:" sorted special ids )[:16 hex]

Equal fingerprints mean every token id names the same token on both sides, so the target's ids
decode correctly with the draft's tokenizer. The embedding row count (``Ready.vocab_size``) may
legitimately differ (padded embeddings), so it is not compared.
"""

from __future__ import annotations

import hashlib
from typing import Any


def fingerprint(tokenizer: Any) -> str:
    """The fingerprint of a transformers tokenizer (see the module docstring); ~0.1 s for 150k entries."""
    h = hashlib.sha256()
    for token, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        h.update(f"{i}\t{token}\n".encode())
    h.update(("special:" + ",".join(map(str, sorted(tokenizer.all_special_ids)))).encode())
    return h.hexdigest()[:16]
