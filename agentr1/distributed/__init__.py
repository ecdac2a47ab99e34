"""Past one process (docs/distributed.md): rollout workers, trainer ranks and tool
actors as Ray actors. Nothing here imports Ray until a run asks for it
(``distributed.*`` in the config); `import agentr1` never does."""
