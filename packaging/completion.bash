
# The context of the word being completed: dlrun's own flags, a control command's (status,
# events, stop), the bundled trainer's after `train`, dlrund's, or an entry point's arguments.
_dlrun() {
  local cur=${COMP_WORDS[COMP_CWORD]} context word flag i
  case ${COMP_WORDS[0]##*/} in
    dlrund) context=dlrund ;;
    dlrun-train) context=train ;;
    *) context=dlrun ;;
  esac
  for ((i = 1; i < COMP_CWORD; i++)); do
    word=${COMP_WORDS[i]}
    if [[ $word == -* ]]; then
      # A flag's value is the next word, or the one after "=" (a word of its own in bash).
      if [[ ${_dlrun_valued[$context]} == *" $word "* ]]; then
        [[ ${COMP_WORDS[i + 1]} == "=" ]] && ((i++))
        ((i++))
      fi
    elif [[ $context == dlrun && $i == 1 && $word =~ ^(status|events|stop)$ ]]; then
      context=$word
    elif [[ $context == dlrun && $word == train ]]; then
      context=train
    elif [[ $context == dlrun ]]; then
      compopt -o default  # the entry point's own arguments: files
      COMPREPLY=()
      return
    fi
  done

  flag=${COMP_WORDS[COMP_CWORD - 1]}
  [[ $flag == "=" ]] && flag=${COMP_WORDS[COMP_CWORD - 2]}
  if [[ $cur == "=" ]]; then
    flag=${COMP_WORDS[COMP_CWORD - 1]} cur=""
  fi
  if [[ $flag == -* && ${_dlrun_valued[$context]} == *" $flag "* ]]; then
    if [[ -n ${_dlrun_choices["$context $flag"]} ]]; then
      mapfile -t COMPREPLY < <(compgen -W "${_dlrun_choices["$context $flag"]}" -- "$cur")
    else
      compopt -o default  # paths, host names, numbers: let bash offer files
      COMPREPLY=()
    fi
    return
  fi

  if [[ $cur == -* ]]; then
    local candidates=()
    # torchrun's underscore spellings only for a word that has one, so --nproc completes to
    # the one flag --nproc-per-node.
    for word in ${_dlrun_flags[$context]}; do
      [[ $word == --*_* && $cur != *_* ]] || candidates+=("$word")
    done
    mapfile -t COMPREPLY < <(compgen -W "${candidates[*]}" -- "$cur")
  elif [[ $context == dlrun ]]; then
    local words=train
    ((COMP_CWORD == 1)) && words="status events stop train"
    mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
    compopt -o default  # or a program or script
  fi
}
complete -F _dlrun dlrun dlrund dlrun-train
