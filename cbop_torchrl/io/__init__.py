"""Files and folders: the cache, atomic writes, owned outputs, and the failures of writing.

=================  ==========================================================================
module             job
=================  ==========================================================================
``roots``          where the package writes: the cache root, owned folders, output setting
``failures``       a full disk, a refused write, a special file, a foreign file, no memory
``folders``        folders made on the way to a file, never through a link
``temporaries``    temporary files beside their final name; the abandoned ones removed
``cache``          the cache's folders, the keys of its entries, the lock on an entry
``reading``        regular files only, never blocking; their JSON; what a wrong file holds
``atomic``         atomic writes, one at a time or renamed together
``manifest``       which files of a user's folder the package wrote (only those replaced)
``walking``        the one walker of folders of inputs: regular files only, the others named
=================  ==========================================================================
"""

from cbop_torchrl.io.atomic import (
    atomic_json_dump,
    atomic_torch_save,
    atomic_write,
    deferred_replace,
    guarded_writes,
)
from cbop_torchrl.io.cache import (
    LOCK_REPORT_INTERVAL_S,
    cache_dir,
    cache_entry_lock,
    config_hash,
)
from cbop_torchrl.io.failures import (
    DiskFullError,
    ForeignFileError,
    SpecialFileError,
    WriteRefusedError,
    as_disk_full_error,
    check_free_space,
    disk_full_error,
    is_disk_full,
    is_out_of_memory,
    out_of_memory_message,
    refused_write,
    tensor_bytes,
    write_failure,
    write_refused,
)
from cbop_torchrl.io.folders import check_no_link, linked_part, make_dirs
from cbop_torchrl.io.manifest import (
    OUTPUTS_MANIFEST,
    check_owned_output,
    owned_outputs,
    remove_stale_outputs,
)
from cbop_torchrl.io.reading import (
    describe_load_error,
    file_kind,
    is_regular_file,
    read_json,
    read_json_object,
    read_regular_bytes,
    read_regular_json,
    read_regular_text,
    require_regular_file,
    special_file_kind,
)
from cbop_torchrl.io.roots import (
    add_write_root,
    cache_root,
    is_within,
    set_output_setting,
    unwritable_reason,
)
from cbop_torchrl.io.temporaries import (
    STALE_AFTER_S,
    TEMPORARY_SUFFIX,
    make_temporary,
    open_own_file,
    remove_stale_temporaries,
)
from cbop_torchrl.io.walking import find_regular_files

__all__ = [
    "LOCK_REPORT_INTERVAL_S",
    "OUTPUTS_MANIFEST",
    "STALE_AFTER_S",
    "TEMPORARY_SUFFIX",
    "DiskFullError",
    "ForeignFileError",
    "SpecialFileError",
    "WriteRefusedError",
    "add_write_root",
    "as_disk_full_error",
    "atomic_json_dump",
    "atomic_torch_save",
    "atomic_write",
    "cache_dir",
    "cache_entry_lock",
    "cache_root",
    "check_free_space",
    "check_no_link",
    "check_owned_output",
    "config_hash",
    "deferred_replace",
    "describe_load_error",
    "disk_full_error",
    "file_kind",
    "find_regular_files",
    "require_regular_file",
    "guarded_writes",
    "is_disk_full",
    "is_out_of_memory",
    "is_regular_file",
    "is_within",
    "linked_part",
    "make_dirs",
    "make_temporary",
    "open_own_file",
    "out_of_memory_message",
    "owned_outputs",
    "read_json",
    "read_json_object",
    "read_regular_bytes",
    "read_regular_json",
    "read_regular_text",
    "refused_write",
    "remove_stale_outputs",
    "remove_stale_temporaries",
    "set_output_setting",
    "special_file_kind",
    "tensor_bytes",
    "unwritable_reason",
    "write_failure",
    "write_refused",
]
