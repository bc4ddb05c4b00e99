"""Fake vllm/v1/request.py: Request with block_hashes (connector-api.md §1.5).
block_hashes[i] is the chained hash of the first (i+1)*block_size tokens, the
sha256 of pickle((parent or NONE_HASH, tuple(tokens), extra_keys)) as in
vllm/v1/core/kv_cache_utils.py; append-only, extended as tokens are appended."""
import enum
import hashlib
import pickle

NONE_HASH = hashlib.sha256(b"fake-vllm-none-hash (PYTHONHASHSEED set)").digest()


def hash_block_tokens(parent, tokens, extra_keys=None):
    return hashlib.sha256(pickle.dumps((parent or NONE_HASH, tuple(tokens), extra_keys),
                                       protocol=pickle.HIGHEST_PROTOCOL)).digest()


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status):
        return status > RequestStatus.PREEMPTED


class SamplingParams:
    def __init__(self, max_tokens=16, extra_args=None):
        self.max_tokens = max_tokens
        self.extra_args = extra_args


class Request:
    def __init__(self, request_id, prompt_token_ids, sampling_params=None, block_size=16,
                 hash_block_size=None, lora_request=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self._all_token_ids = list(prompt_token_ids)
        self._output_token_ids = []
        self.sampling_params = sampling_params or SamplingParams()
        self.lora_request = lora_request
        self.mm_features = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_external_computed_tokens = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.kv_transfer_params = None
        self.stop_reason = None
        self._hash_block_size = hash_block_size or block_size
        self.block_hashes = []
        self.update_block_hashes()

    def update_block_hashes(self):
        hb = self._hash_block_size
        while (len(self.block_hashes) + 1) * hb <= len(self._all_token_ids):
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else None
            self.block_hashes.append(hash_block_tokens(parent, self._all_token_ids[i * hb:(i + 1) * hb]))

    @property
    def all_token_ids(self):
        return tuple(self._all_token_ids)

    @property
    def output_token_ids(self):
        return tuple(self._output_token_ids)

    @property
    def num_tokens(self):
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self):
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self):
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_ids):
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def is_finished(self):
        return RequestStatus.is_finished(self.status)
