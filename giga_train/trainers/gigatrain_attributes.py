"""The Trainer attributes GigaTrain's Trainer sets from its keywords and projects read (`self.log_interval`,
`self.with_ema`, `self.seed`, ...): each reads the train section (defaults filled by the schema). A project
may still assign one (GigaTrain's are plain attributes): the assigned value then wins, for that trainer."""

GIGATRAIN_ATTRIBUTES = (
    "data_parallel_size", "log_interval", "log_cpu_memory", "checkpoint_interval", "checkpoint_total_limit",
    "checkpoint_keeps", "checkpoint_save_optimizer", "checkpoint_safe_serialization", "checkpoint_strict",
    "activation_checkpointing", "activation_class_names", "seed", "with_ema",
)


class TrainOption:
    """`self.<name>`: the train section's value (a non-data descriptor: an assignment shadows it)."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return obj.train_config.get(self.name)


class GigaTrainAttributes:
    pass


for _name in GIGATRAIN_ATTRIBUTES:
    _option = TrainOption()
    _option.__set_name__(GigaTrainAttributes, _name)
    setattr(GigaTrainAttributes, _name, _option)
