-- Back to 0019: commits carry no check of the transaction's mark.
DROP FUNCTION {schema}.onceflow_same_transaction(text);
