// Token files, the token authenticator and subject rules (ordo/identity.hpp).
#include "ordo/identity.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "ordo/error.hpp"

namespace ordo {

namespace {

constexpr std::size_t max_token_file_bytes = std::size_t{1} << 20;
constexpr std::size_t min_token_chars = 16;

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
    throw_error(errc::bad_address, "ordo: token file " + path + ": " + why);
}

std::string read_whole(const std::string& path) {
    // Tokens are secrets: as ssh does with a private key, a file others may read is refused
    // rather than used (a pipe or /dev/fd/N has no such mode to check).
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) != 0) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
        bad_file(path, std::string("may be read or written by group or others (mode ") + mode +
                           "); tokens are secrets: chmod 600 " + path);
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) bad_file(path, "cannot be read");
    std::string text;
    char chunk[4096];
    while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
        text.append(chunk, static_cast<std::size_t>(in.gcount()));
        if (text.size() > max_token_file_bytes) bad_file(path, "is larger than 1 MiB");
    }
    return text;
}

std::string trimmed(std::string_view s) {
    const auto first = s.find_first_not_of(" \t\r");
    if (first == std::string_view::npos) return {};
    const auto last = s.find_last_not_of(" \t\r");
    return std::string(s.substr(first, last - first + 1));
}

// Compares in time that depends on the lengths only, not on where the bytes differ.
bool same_secret(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    unsigned char diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        diff |= static_cast<unsigned char>(a[i] ^ b[i]);
    return diff == 0;
}

}  // namespace

std::map<std::string, std::string> read_token_file(const std::string& path) {
    const std::string text = read_whole(path);
    std::map<std::string, std::string> tokens;
    std::istringstream lines(text);
    std::string line;
    for (std::size_t n = 1; std::getline(lines, line); ++n) {
        const std::string l = trimmed(line);
        if (l.empty() || l[0] == '#') continue;
        const auto space = l.find_first_of(" \t");
        const std::string where = "line " + std::to_string(n);
        if (space == std::string::npos) bad_file(path, where + " has a token and no subject");
        std::string token = l.substr(0, space);
        std::string subject = trimmed(std::string_view(l).substr(space + 1));
        if (token.size() < min_token_chars)
            bad_file(path, where + ": a token needs at least 16 characters");
        if (!tokens.emplace(std::move(token), std::move(subject)).second)
            bad_file(path, where + " repeats a token");
    }
    // An empty table would let a server or gateway that reads it authenticate nobody, or
    // (where an empty table means "off") everybody: neither is what the file's owner meant.
    if (tokens.empty()) bad_file(path, "has no tokens");
    return tokens;
}

std::string read_token(const std::string& path) {
    const std::string text = read_whole(path);
    std::string token = trimmed(std::string_view(text).substr(0, text.find('\n')));
    if (token.empty()) bad_file(path, "has no token on its first line");
    return token;
}

authenticate_fn authenticate_tokens(std::map<std::string, std::string> tokens) {
    return [tokens = std::move(tokens)](const identity& who, const credentials& presented) {
        if (presented.token.empty()) {
            if (!who.cert_subject.empty()) return auth_verdict::accept(who.cert_subject);
            return auth_verdict::refuse(
                "the server requires a token (peer_options::credentials, or the URL parameter "
                "token_file=PATH)");
        }
        // Every entry is compared, so that the time taken does not say which one was close.
        const std::string* subject = nullptr;
        for (const auto& [token, s] : tokens)
            if (same_secret(token, presented.token)) subject = &s;
        if (!subject) return auth_verdict::refuse("the token presented is not accepted");
        return auth_verdict::accept(*subject);
    };
}

allow_fn allow_subjects(std::vector<std::string> subjects) {
    std::set<std::string, std::less<>> set(subjects.begin(), subjects.end());
    return [set = std::move(set)](const identity& who) {
        return !who.subject.empty() && set.count(who.subject) > 0;
    };
}

}  // namespace ordo
