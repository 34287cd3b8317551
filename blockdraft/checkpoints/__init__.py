"""Every drafter file the library reads or writes (resume/optimizer state is `train/checkpoint.py`).

- `dflash.py`        the released DFlash format (config.json + model.safetensors), the key maps,
                     fresh drafters (`init_drafter`)
- `headed.py`        drafters with heads: heads saved under `{name}_head.` in the same file;
                     `load_drafter` reads plain and headed folders alike
- `local_head.py`    standalone DeLS-Spec local head folders, attached to a drafter from disk
- `dspark_import.py` released DSpark checkpoints converted into the format above

Exports for other engines are `blockdraft.export`. Writes go through `blockdraft.files.atomic_write_folder`.
"""

from .dflash import (CONFIG_NAME, KEY_MAPS, WEIGHTS_NAME, check_finite, copy_target_layers, default_mask_token_id,
                     head_prefix, init_drafter, load_drafter_model, load_strict, new_drafter_config, remap_keys,
                     save_drafter)
from .dspark_import import import_dspark
from .headed import attach_saved_heads, load_drafter, save_headed_drafter
from .local_head import attach_local_head, fusion_head, load_local_head, save_local_head

__all__ = ["CONFIG_NAME", "KEY_MAPS", "WEIGHTS_NAME", "attach_local_head", "attach_saved_heads", "check_finite",
           "copy_target_layers", "default_mask_token_id", "fusion_head", "head_prefix", "import_dspark",
           "init_drafter", "load_drafter", "load_drafter_model", "load_local_head", "load_strict",
           "new_drafter_config", "remap_keys", "save_drafter", "save_headed_drafter", "save_local_head"]
