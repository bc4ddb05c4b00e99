"""A FAKE vllm package for tests of umbp.vllm.connector: only the modules and
classes the connector (and the harness) touch, shaped after the vLLM sources
recorded in shared/reference (field names exactly as there).  Put on sys.path
only by connector/tests.  FAKE_VLLM_API picks ONE real base.py version
(kv_connector/v1/base.py says which): "old" (13f4ad0f: no SupportsHMA, no
KVConnectorWorkerMetadata, no get_transfer_results, no metrics or kv_events
modules' newer names), "003df296", "new" (the default: 7ba3df63), "00f4240e"."""
import os

FAKE = True
API = os.environ.get("FAKE_VLLM_API", "new")
__version__ = "0.0.0+fake-" + API
