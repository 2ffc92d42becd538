-- Reserved for the compensation migration, which is written on another
-- branch; this empty step keeps the versions without a gap until then.
SELECT 1;
