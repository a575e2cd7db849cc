"""Models named by a Hugging Face Hub id (`model.hub_id`): resolved, before a service builds
anything, to their snapshot directory in the standard Hugging Face cache, downloading it there
first when it is missing.

`huggingface_hub.snapshot_download` does the work and keeps the hub's own cache layout
(`$HF_HOME/hub/models--<org>--<name>/snapshots/<commit>/`, `refs/<branch>`), so a model that
any Hugging Face tool downloaded before is found again, and one downloaded here is found by
them. With HF_HUB_OFFLINE=1 nothing reaches the Hub: the cache answers or the run stops with
an error naming `model.hub_id`. A commit hash as the revision is looked up in the cache only.

`rlrun local` resolves once, then hands the services the commit it found
(`model.hub_revision`), so that each service's own resolution is a cache lookup of the same
snapshot and none of them calls the Hub.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlrun.common.config import ConfigError, RunConfig

FIELD = "model.hub_id"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def snapshot_dir(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot directory of `repo_id` at `revision` (a branch, tag or commit;
    None: main), downloaded into the Hugging Face cache when missing. Raises ConfigError
    naming model.hub_id when it can be neither found nor downloaded."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ConfigError(
            FIELD, "a Hub model needs the huggingface_hub package (pip install huggingface_hub)"
        ) from None
    from huggingface_hub import constants

    at = f" at revision {revision!r}" if revision else ""
    cache = constants.HF_HUB_CACHE
    local_only = revision is not None and bool(COMMIT.match(revision))
    try:
        path = snapshot_download(repo_id, revision=revision, local_files_only=local_only)
    except LocalEntryNotFoundError as error:
        offline = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        if local_only:
            offline = "a commit is looked up in the cache only"
        raise ConfigError(
            FIELD,
            f"{repo_id!r}{at} is not in the Hugging Face cache ({cache}) and {offline}: download it "
            f"once with network access (the same command, or `hf download {repo_id}`), or set "
            f"model.path to a local checkpoint ({type(error).__name__})",
        ) from None
    except (GatedRepoError, RepositoryNotFoundError) as error:
        raise ConfigError(
            FIELD, f"{repo_id!r} is not on the Hub or needs a token (HF_TOKEN): {error}"
        ) from None
    except (RevisionNotFoundError, EntryNotFoundError) as error:
        raise ConfigError(FIELD, f"{repo_id!r} has no revision {revision!r}: {error}") from None
    except HfHubHTTPError as error:
        raise ConfigError(FIELD, f"downloading {repo_id!r}{at} failed: {error}") from None
    except Exception as error:  # the HTTP client's own errors (connection reset, timeouts), OSError
        raise ConfigError(
            FIELD, f"downloading {repo_id!r}{at} into {cache} failed: {type(error).__name__}: {error}"
        ) from None
    path = Path(path)
    if not (path / "config.json").exists():
        raise ConfigError(FIELD, f"{repo_id!r}{at} has no config.json ({path}): not a model checkpoint")
    return path


def resolve_hub_model(config: RunConfig) -> RunConfig:
    """`config` with model.path set to the snapshot of model.hub_id (downloaded if missing) and
    model.hub_revision pinned to its commit; unchanged when no Hub model is named."""
    model = config.model
    if model.hub_id is None:
        return config
    path = snapshot_dir(model.hub_id, model.hub_revision)
    resolved = model.model_copy(update={"path": path, "hub_revision": path.name})
    return config.model_copy(update={"model": resolved})
