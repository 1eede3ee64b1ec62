import warnings

import torch

# Tiny models run fastest on one thread (and tests then do not fight over cores).
torch.set_num_threads(1)
warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
