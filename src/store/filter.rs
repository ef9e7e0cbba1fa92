//! The list filter: the subset of AIP-160 that the Batches API documents.
//!
//! ```text
//! filter     := or_expr
//! or_expr    := and_expr ("OR" and_expr)*      -- AIP-160: OR binds tighter
//! and_expr   := unary ("AND" unary)*              than AND, see `parse_and`
//! unary      := ["NOT" | "-"] primary
//! primary    := "(" filter ")" | field op value
//! field      := batch_id | batch_uuid | state | create_time | labels.KEY
//! op         := = | != | < | <= | > | >=
//! value      := "quoted string" | bare-word
//! ```
//!
//! Parsing is pure; [`Filter::push_sql`] renders the tree as a SQL boolean
//! with every value bound, never spliced.

use super::Backend;
use super::sql::Sql;
use chrono::{DateTime, Utc};

use crate::api::{State, quote};

/// A parsed filter; the empty filter matches everything.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Filter {
    root: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Not(Box<Expr>),
    Cmp(Field, Op, Value),
}

#[derive(Debug, Clone, PartialEq)]
enum Field {
    BatchId,
    BatchUuid,
    State,
    CreateTime,
    Label(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    fn sql(self) -> &'static str {
        match self {
            Op::Eq => " = ",
            Op::Ne => " != ",
            Op::Lt => " < ",
            Op::Le => " <= ",
            Op::Gt => " > ",
            Op::Ge => " >= ",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Text(String),
    Int(i64),
}

/// Nesting deeper than this is refused, so a hostile filter cannot exhaust
/// the stack.
const MAX_DEPTH: usize = 32;
/// Longest accepted filter, in bytes.
pub(crate) const MAX_FILTER_BYTES: usize = 4096;

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    /// Parses a filter string; the error says where and what is accepted.
    pub fn parse(input: &str) -> Result<Filter, String> {
        if input.len() > MAX_FILTER_BYTES {
            return Err(format!(
                "filter is {} bytes; at most {MAX_FILTER_BYTES} are accepted",
                input.len()
            ));
        }
        let tokens = lex(input)?;
        if tokens.is_empty() {
            return Ok(Filter::default());
        }
        let mut p = Parser { tokens, pos: 0 };
        let root = p.parse_and(0)?;
        if let Some(t) = p.tokens.get(p.pos) {
            return Err(format!("unexpected {} in filter", t.describe()));
        }
        Ok(Filter { root: Some(root) })
    }

    /// Appends the filter as a SQL boolean expression over `batches`.
    pub(super) fn push_sql(&self, q: &mut Sql<'_>, backend: Backend) {
        match &self.root {
            Some(e) => push_expr(e, q, backend),
            None => {
                q.push("1 = 1");
            }
        }
    }
}

fn push_expr(e: &Expr, q: &mut Sql<'_>, backend: Backend) {
    match e {
        Expr::And(parts) | Expr::Or(parts) => {
            let joiner = if matches!(e, Expr::And(_)) {
                " and "
            } else {
                " or "
            };
            q.push("(");
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    q.push(joiner);
                }
                push_expr(part, q, backend);
            }
            q.push(")");
        }
        Expr::Not(inner) => {
            q.push("not (");
            push_expr(inner, q, backend);
            q.push(")");
        }
        Expr::Cmp(field, op, value) => {
            match field {
                Field::BatchId => q.push("batch_id"),
                Field::BatchUuid => q.push("uuid"),
                Field::State => q.push("state"),
                Field::CreateTime => q.push("create_time"),
                Field::Label(key) => match backend {
                    Backend::Sqlite => q
                        .push("coalesce(json_extract(spec, ")
                        .bind(format!("$.labels.\"{key}\""))
                        .push("), '')"),
                    Backend::Postgres => q
                        .push("coalesce(spec::jsonb -> 'labels' ->> ")
                        .bind(key.clone())
                        .push(", '')"),
                },
            };
            q.push(op.sql());
            match value {
                Value::Text(s) => q.bind(s.clone()),
                Value::Int(n) => q.bind(*n),
            };
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Op(Op),
    LParen,
    RParen,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Word(w) => quote(w),
            Token::Quoted(s) => format!("string {}", quote(s)),
            Token::Op(_) => "operator".into(),
            Token::LParen => "'('".into(),
            Token::RParen => "')'".into(),
        }
    }
}

fn lex(input: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = input.char_indices().peekable();
    while let Some(&(i, c)) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' => {
                chars.next();
                tokens.push(Token::LParen);
            }
            ')' => {
                chars.next();
                tokens.push(Token::RParen);
            }
            '=' => {
                chars.next();
                tokens.push(Token::Op(Op::Eq));
            }
            '!' | '<' | '>' => {
                chars.next();
                let eq = chars.peek().is_some_and(|&(_, n)| n == '=');
                if eq {
                    chars.next();
                }
                tokens.push(Token::Op(match (c, eq) {
                    ('!', true) => Op::Ne,
                    ('<', false) => Op::Lt,
                    ('<', true) => Op::Le,
                    ('>', false) => Op::Gt,
                    ('>', true) => Op::Ge,
                    _ => return Err(format!("unexpected '!' at offset {i} in filter; use !=")),
                }));
            }
            '"' | '\'' => {
                chars.next();
                let mut s = String::new();
                let mut closed = false;
                while let Some((_, ch)) = chars.next() {
                    match ch {
                        '\\' => match chars.next() {
                            Some((_, esc)) => s.push(esc),
                            None => break,
                        },
                        ch if ch == c => {
                            closed = true;
                            break;
                        }
                        ch => s.push(ch),
                    }
                }
                if !closed {
                    return Err(format!(
                        "unterminated string starting at offset {i} in filter"
                    ));
                }
                tokens.push(Token::Quoted(s));
            }
            _ => {
                let mut w = String::new();
                while let Some(&(_, ch)) = chars.peek() {
                    if ch.is_whitespace() || "()=!<>\"'".contains(ch) {
                        break;
                    }
                    w.push(ch);
                    chars.next();
                }
                tokens.push(Token::Word(w));
            }
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek_word(&self, word: &str) -> bool {
        matches!(self.tokens.get(self.pos), Some(Token::Word(w)) if w == word)
    }

    /// A sequence joined by AND (or juxtaposition, which AIP-160 reads as
    /// AND). Its parts are OR-sequences: in AIP-160 OR binds tighter.
    fn parse_and(&mut self, depth: usize) -> Result<Expr, String> {
        if depth > MAX_DEPTH {
            return Err(format!("filter nests deeper than {MAX_DEPTH} levels"));
        }
        let mut parts = vec![self.parse_or(depth)?];
        loop {
            if self.peek_word("AND") {
                self.pos += 1;
            } else if matches!(self.tokens.get(self.pos), None | Some(Token::RParen)) {
                break;
            }
            parts.push(self.parse_or(depth)?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Expr::And(parts)
        })
    }

    fn parse_or(&mut self, depth: usize) -> Result<Expr, String> {
        let mut parts = vec![self.parse_unary(depth)?];
        while self.peek_word("OR") {
            self.pos += 1;
            parts.push(self.parse_unary(depth)?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Expr::Or(parts)
        })
    }

    fn parse_unary(&mut self, depth: usize) -> Result<Expr, String> {
        if self.peek_word("NOT") || self.peek_word("-") {
            self.pos += 1;
            return Ok(Expr::Not(Box::new(self.parse_primary(depth)?)));
        }
        self.parse_primary(depth)
    }

    fn parse_primary(&mut self, depth: usize) -> Result<Expr, String> {
        match self.tokens.get(self.pos).cloned() {
            Some(Token::LParen) => {
                self.pos += 1;
                let e = self.parse_and(depth + 1)?;
                match self.tokens.get(self.pos) {
                    Some(Token::RParen) => {
                        self.pos += 1;
                        Ok(e)
                    }
                    _ => Err("missing ')' in filter".into()),
                }
            }
            Some(Token::Word(w)) => {
                self.pos += 1;
                let field = parse_field(&w)?;
                let op = match self.tokens.get(self.pos) {
                    Some(Token::Op(op)) => *op,
                    other => {
                        return Err(format!(
                            "expected a comparison operator (=, !=, <, <=, >, >=) after {}, found {}",
                            quote(&w),
                            other.map_or("the end".to_string(), Token::describe)
                        ));
                    }
                };
                self.pos += 1;
                let raw = match self.tokens.get(self.pos) {
                    Some(Token::Word(v) | Token::Quoted(v)) => v.clone(),
                    other => {
                        return Err(format!(
                            "expected a value after the operator, found {}",
                            other.map_or("the end".to_string(), Token::describe)
                        ));
                    }
                };
                self.pos += 1;
                let value = parse_value(&field, op, &raw)?;
                Ok(Expr::Cmp(field, op, value))
            }
            Some(other) => Err(format!("unexpected {} in filter", other.describe())),
            None => Err("filter ends where a comparison was expected".into()),
        }
    }
}

fn parse_field(word: &str) -> Result<Field, String> {
    Ok(match word {
        "batch_id" => Field::BatchId,
        "batch_uuid" => Field::BatchUuid,
        "state" => Field::State,
        "create_time" => Field::CreateTime,
        w if w.starts_with("labels.") => {
            let key = &w["labels.".len()..];
            if !crate::spec::is_label_key(key) {
                return Err(format!(
                    "label key {} is invalid in filter: {}",
                    quote(key),
                    crate::spec::LABEL_KEY_RULE
                ));
            }
            Field::Label(key.to_string())
        }
        other => {
            return Err(format!(
                "cannot filter on {}; accepted fields: batch_id, batch_uuid, state, create_time, labels.KEY",
                quote(other)
            ));
        }
    })
}

fn parse_value(field: &Field, op: Op, raw: &str) -> Result<Value, String> {
    match field {
        Field::State => {
            if !matches!(op, Op::Eq | Op::Ne) {
                return Err("state can only be compared with = or !=".into());
            }
            let state = State::from_name(raw).ok_or_else(|| {
                format!(
                    "{} is not a batch state; accepted: {}",
                    quote(raw),
                    State::ALL.map(|s| s.name()).join(", ")
                )
            })?;
            Ok(Value::Int(i64::from(state.number())))
        }
        Field::CreateTime => {
            let t: DateTime<Utc> = DateTime::parse_from_rfc3339(raw)
                .map_err(|_| {
                    format!(
                        "{} is not an RFC 3339 timestamp (e.g. \"2026-01-01T00:00:00Z\")",
                        quote(raw)
                    )
                })?
                .with_timezone(&Utc);
            Ok(Value::Int(t.timestamp_micros()))
        }
        Field::BatchId | Field::BatchUuid | Field::Label(_) => Ok(Value::Text(raw.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(f: &str) -> String {
        sql_for(f, Backend::Sqlite)
    }

    fn sql_for(f: &str, backend: Backend) -> String {
        let filter = Filter::parse(f).expect(f);
        let mut q = Sql::new(backend, "");
        filter.push_sql(&mut q, backend);
        q.text().to_string()
    }

    #[test]
    fn the_documented_example_parses() {
        assert_eq!(
            sql("state = RUNNING AND create_time < \"2026-01-01T00:00:00Z\""),
            "(state = ? and create_time < ?)"
        );
    }

    #[test]
    fn or_binds_tighter_than_and() {
        assert_eq!(
            sql("batch_id = a AND state = PENDING OR state = RUNNING"),
            "(batch_id = ? and (state = ? or state = ?))"
        );
        assert_eq!(sql("NOT (state = FAILED)"), "not (state = ?)");
        assert_eq!(
            sql("labels.team = ml"),
            "coalesce(json_extract(spec, ?), '') = ?"
        );
        assert_eq!(
            sql_for("labels.team = ml", Backend::Postgres),
            "coalesce(spec::jsonb -> 'labels' ->> $1, '') = $2"
        );
    }

    #[test]
    fn bad_filters_say_what_is_accepted() {
        for (f, fragment) in [
            ("state = DONE", "accepted: STATE_UNSPECIFIED"),
            ("state > RUNNING", "only be compared with = or !="),
            ("owner = me", "accepted fields"),
            ("create_time < yesterday", "RFC 3339"),
            ("state =", "expected a value"),
            ("state RUNNING", "expected a comparison operator"),
            ("(state = RUNNING", "missing ')'"),
            ("batch_id = \"abc", "unterminated string"),
            ("state ! RUNNING", "use !="),
            // The key a create refuses as a label is refused here too.
            ("labels.1abc = x", "starting with a letter"),
            ("labels. = x", "label key \"\" is invalid"),
        ] {
            let err = Filter::parse(f).expect_err(f);
            assert!(err.contains(fragment), "{f}: {err}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let f = format!(
            "{}state = RUNNING{}",
            "(".repeat(10_000),
            ")".repeat(10_000)
        );
        assert!(
            Filter::parse(&f).expect_err("deep").contains("bytes") || Filter::parse(&f).is_err()
        );
        let f = format!("{}state = RUNNING{}", "(".repeat(100), ")".repeat(100));
        assert!(Filter::parse(&f).expect_err("deep").contains("deeper than"));
    }

    #[test]
    fn empty_matches_everything() {
        assert!(Filter::parse("  ").expect("empty").is_empty());
    }
}
