DROP TABLE {schema}.onceflow_keys;
