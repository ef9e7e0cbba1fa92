-- Each config put in force (at a start or a reload) whose live part
-- differs from the one before: every replica applies the latest.
create table config_generations (
    generation bigint primary key,
    digest text not null,
    live text not null,
    loaded_at bigint not null,
    loaded_by text not null,
    how text not null
);
