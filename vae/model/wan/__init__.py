"""What the Wan-architecture families (wan21, wan22, qwen21) share: their blocks and model base
(`network.py`) and how a checkpoint of theirs is read (`checkpoint.py`)."""
