"""What the Wan-architecture families (wan21, wan22, qwen21) share: how a checkpoint of theirs is read
(`checkpoint.py`)."""
