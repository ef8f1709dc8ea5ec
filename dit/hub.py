"""A model given by its Hugging Face Hub name, `ORG/NAME[@REVISION]` as every diffusers user types it, turned
into the local pipeline folder it is cached in (`huggingface_hub.snapshot_download`: the standard cache,
`HF_HOME`/`HF_HUB_CACHE`, `HF_HUB_OFFLINE`, `HF_TOKEN`). A path that exists stays a path.

Only what a pipeline folder needs is downloaded (configs, safetensors weights, tokenizer files), not the
`.bin`/`.pth` copies many repositories also hold. The process that starts the ranks resolves the name and
then goes offline (HF_HUB_OFFLINE=1 in its environment): the ranks it starts, which read the same
arguments, find the files in the cache instead of asking the Hub once each.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# ORG/NAME, each part what the Hub allows (letters, digits, - _ .), then an optional @branch, tag or commit
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?")
# what a pipeline folder's parts are read from (configs, weights, tokenizers: tokenizer.json, spiece.model,
# vocab.txt, merges.txt)
FOLDER_FILES = ["*.json", "*.safetensors", "*.model", "*.txt"]


def is_hub_name(model: str | None) -> bool:
    """Whether `model` names a Hub repository rather than a folder here."""
    return model is not None and not Path(model).exists() and HUB_NAME.fullmatch(model) is not None


def local_model(model: str | None) -> str | None:
    """`model`'s local folder: a Hub name's snapshot (downloaded unless cached), anything else unchanged.
    ValueError (one line naming --model-path: what is missing and how to get it) when it cannot be had."""
    if not is_hub_name(model):
        return model
    repo, _, revision = model.partition("@")
    named = f"--model-path {model}"
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = snapshot_download(repo, revision=revision or None, allow_patterns=FOLDER_FILES)
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise ValueError(
                f"{named}: not a folder here and not in the Hugging Face cache ({constants.HF_HUB_CACHE}); "
                f"HF_HUB_OFFLINE is set: download it where the network is (hf download {repo}"
                f"{f' --revision {revision}' if revision else ''}) and copy the cache, or give a folder"
            ) from None
        raise ValueError(f"{named}: not a folder here, and the Hugging Face Hub cannot be reached") from None
    except HFValidationError as e:  # a name our pattern takes and the Hub's own rules do not: org/na--me
        raise ValueError(f"{named}: not a folder here, nor a Hub repository name ({e})") from None
    except GatedRepoError:
        raise ValueError(f"{named}: a gated repository; accept its terms and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"{named}: no such folder here, nor repository on the Hub (or it is private: set HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ValueError(f"{named}: the repository has no revision {revision!r}") from None
    except HfHubHTTPError as e:
        raise ValueError(f"{named}: the Hub answered {str(e).splitlines()[0]}") from None
    from dit.parts import check_parts

    try:  # a download that stopped part way: said of the name, with what mends it
        check_parts(Path(folder))
    except ValueError as e:
        raise ValueError(
            f"{named}: its cached snapshot {folder} is incomplete ({e}); download it again (hf download "
            f"{repo}{f' --revision {revision}' if revision else ''})"
        ) from None
    os.environ["HF_HUB_OFFLINE"] = "1"  # for the processes this one starts: the files are cached now
    return folder
