DROP TABLE {schema}.onceflow_pace_slots;
DROP TABLE {schema}.onceflow_pace;
