"""flowrl: turn what a running agent does into training data and a better model for it.

`import flowrl` is light: it imports no torch, transformers, trl, peft or datasets. Every public
name is resolved on first use from the module that defines it.
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports
from flowrl.version import __version__

_LAZY: dict[str, str] = {
    # capture
    "hook_into_agent": "flowrl.capture",
    "capture_llm_calls": "flowrl.capture.grouping",
    "CallCapture": "flowrl.capture.grouping",
    "Hook": "flowrl.capture",
    "TraceCollector": "flowrl.capture",
    "current_run": "flowrl.capture.run_handle",
    "RunHandle": "flowrl.capture.run_handle",
    "HostOutcome": "flowrl.trace.outcomes",
    # schema and store
    "ExecutionTrace": "flowrl.trace.schema",
    "ToolCallTrace": "flowrl.trace.schema",
    "ReasoningStep": "flowrl.trace.schema",
    "LLMCall": "flowrl.trace.schema",
    "TraceStore": "flowrl.store.files",
    "Redactor": "flowrl.trace.redact",
    "FlowRLError": "flowrl.errors",
    # ingest
    "CheckpointLoader": "flowrl.ingest",
    # rewards
    "RewardResult": "flowrl.rewards",
    "RewardEngine": "flowrl.rewards",
    "CodeExecutionReward": "flowrl.rewards",
    "SyntaxValidationReward": "flowrl.rewards",
    "ToolSuccessReward": "flowrl.rewards",
    "TaskCompletionReward": "flowrl.rewards",
    "EfficiencyReward": "flowrl.rewards",
    "FormatComplianceReward": "flowrl.rewards",
    "LearnedReward": "flowrl.rewards",
    "LLMJudgeReward": "flowrl.rewards",
    # datasets
    "KTODatasetBuilder": "flowrl.data",
    "GRPODatasetBuilder": "flowrl.data",
    "SFTDatasetBuilder": "flowrl.data",
    "DPODatasetBuilder": "flowrl.data",
    "DatasetPipeline": "flowrl.data",
    # training
    "TrainingConfig": "flowrl.train",
    "RLTrainer": "flowrl.train",
    "TrainingPipeline": "flowrl.train",
    "detect_hardware": "flowrl.train",
    # export
    "GGUFExporter": "flowrl.export",
    "OllamaDeployer": "flowrl.export",
    "ExportPipeline": "flowrl.export",
}

__all__ = ["__version__", *_LAZY]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
